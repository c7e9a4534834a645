"""The supervisor's process tests import their helpers (file_cluster) from this directory."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
