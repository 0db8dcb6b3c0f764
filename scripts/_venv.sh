# Sourced by the scripts in this folder: make .venv (Python 3.11+) and install the project into it.
# Needs only Python, pip and apt; nothing is downloaded except packages from the package index.
# Installs what the stack runs; MODELFORGE_EXTRAS names extras of the developer's install to add
# (scripts/test, lint and mutation-check add `test`: pytest, ruff, mypy, Playwright, cfn-lint, ...).
# The install is skipped when nothing it installs from has changed since the last one: the stamp
# in .venv holds a hash of the Python version, this script, every pyproject.toml and the agent's
# constraints, and the extras installed with them.
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
EXTRAS="${MODELFORGE_EXTRAS:-}"
STAMP="$VENV/.modelforge-install"
# What the install below installs from: a change to any of these (or another Python) installs again.
install_hash() {
  {
    "$VENV/bin/python" -VV
    cat "${BASH_SOURCE[0]}" "$ROOT/pyproject.toml" "$ROOT/agent/constraints.txt"
    for project in protocol agent worker functions tools/cli tools/local_stack; do
      cat "$ROOT/$project/pyproject.toml"
    done
  } | "$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}
installed_hash=""
installed_extras=""
if [ -f "$STAMP" ]; then
  installed_hash="$(sed -n 1p "$STAMP")"
  installed_extras="$(sed -n 2p "$STAMP")"
fi
wanted_hash="$(install_hash)"
if [ "$installed_hash" != "$wanted_hash" ] || { [ -n "$EXTRAS" ] && [ "$installed_extras" != "$EXTRAS" ]; }; then
  rm -f "$STAMP"
  # pip and the build backend first (see PIP_RANGE above)
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
  # commands to the CLI's) and the developer's install itself (with MODELFORGE_EXTRAS). The agent's dependencies at the exact
  # versions its image installs (agent/constraints.txt), so the suite tests what a node runs.
  "$VENV/bin/python" -m pip install --quiet --no-build-isolation -c "$ROOT/agent/constraints.txt" \
    -e "$ROOT/protocol" \
    -e "$ROOT/agent" \
    -e "$ROOT/worker" \
    -e "$ROOT/functions" \
    -e "$ROOT/tools/cli[aws]" \
    -e "$ROOT/tools/local_stack" \
    -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  printf '%s\n%s\n' "$wanted_hash" "$EXTRAS" >"$STAMP"
fi
