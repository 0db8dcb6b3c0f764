# Sourced by the scripts in this folder: make .venv (Python 3.11+) and install the project into it.
# Needs only Python, pip and apt; nothing is downloaded except packages from the package index.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MODELFORGE_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "error: $PYTHON must be Python 3.11 or newer" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    # Debian's system Python keeps venv in a separate package
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$PYTHON" -m venv "$VENV"
    else
      echo "error: cannot create a virtual environment; install python3-venv" >&2
      exit 2
    fi
  fi
fi
# A pip that installs pyproject projects editable, and the build backend the pyproject.toml files
# name, so the four builds below run here rather than in four throwaway environments (seconds
# instead of ten). The pip range is also one chalice accepts (it runs pip to build the Lambda
# bundle and requires pip<26.3; tests/unit/test_dev_scripts.py checks the two agree), so the
# install below never moves pip again: a pip in range is left alone, one outside it is replaced once.
PIP_RANGE="pip>=23.1,<26.3"
"$VENV/bin/python" -m pip install --quiet "$PIP_RANGE" "setuptools>=68" wheel >/dev/null
# Before the split into three distributions, modelforge-compute itself shipped the agent's
# console script, and before modelforge-cli it shipped `modelforge`; reinstalling it would delete
# the script modelforge-node-agent or modelforge-cli installs (and its old editable finder would
# still map modelforge_cli to a folder that moved).
for record in "$VENV"/lib/python3*/site-packages/modelforge_compute-*.dist-info/RECORD; do
  if [ -f "$record" ] && grep -q -e '/modelforge-node-agent,' -e '/bin/modelforge,' "$record"; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes modelforge-compute >/dev/null
  fi
done
# Seven distributions, all editable from this checkout in one call: the shared protocol, the node
# agent (what a GPU host installs), the runtime worker (beside it, with the model runtime), the
# control plane's code, the admin CLI (with [aws] for --aws-sigv4), the local stack (which adds its
# commands to the CLI's) and the developer's install itself with the test extra. The agent's dependencies at the exact
# versions its image installs (agent/constraints.txt), so the suite tests what a node runs.
"$VENV/bin/python" -m pip install --quiet --no-build-isolation -c "$ROOT/agent/constraints.txt" \
  -e "$ROOT/protocol" \
  -e "$ROOT/agent" \
  -e "$ROOT/worker" \
  -e "$ROOT/functions" \
  -e "$ROOT/tools/cli[aws]" \
  -e "$ROOT/tools/local_stack" \
  -e "$ROOT[${MODELFORGE_EXTRAS:-test}]"
