"""Where the tools find the control plane: the repository's folders, and its resource catalogue
(``functions/chalicelib/resources.py``, the one definition of every table and the bucket)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS_DIR = REPO_ROOT / "functions"

if str(FUNCTIONS_DIR) not in sys.path:
    sys.path.insert(0, str(FUNCTIONS_DIR))  # chalicelib, as Chalice packages it

from chalicelib import resources  # noqa: E402  (needs the path above)

__all__ = ["FUNCTIONS_DIR", "REPO_ROOT", "resources"]
