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
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install --quiet -e "$ROOT[${MODELFORGE_EXTRAS:-test}]"
