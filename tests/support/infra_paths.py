"""Paths the infra tests share. `import infra` works because pytest puts the repo root on sys.path (pyproject's
`pythonpath`): infra/ is not an installed package."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
