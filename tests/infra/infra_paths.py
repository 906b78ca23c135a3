"""Paths the infra tests share (a uniquely named module: tests/ has several conftest.py files)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
if str(ROOT) not in sys.path:  # infra/ is not an installed package
    sys.path.insert(0, str(ROOT))
