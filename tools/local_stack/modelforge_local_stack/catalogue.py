"""Where the tools find the control plane: the repository's folders, and its resource catalogue
(``functions/chalicelib/config/resources.py``, the one definition of every table and the bucket)."""

from __future__ import annotations

from pathlib import Path

from chalicelib.config import resources

REPO_ROOT = Path(__file__).resolve().parents[3]
FUNCTIONS_DIR = REPO_ROOT / "functions"

__all__ = ["FUNCTIONS_DIR", "REPO_ROOT", "resources"]
