"""Print the images' constraints file from the current environment (the set the tests passed with).

    python -m infra.lock > infra/docker/constraints.txt
Test-only packages and the project itself are left out; torch loses its local label so the CPU and the
CUDA wheel of the same version both satisfy the pin.
"""

from __future__ import annotations

import re
import subprocess
import sys

TEST_ONLY = {"vtg-posttrain", "pytest", "pytest-timeout", "ruff", "iniconfig", "pluggy", "moto", "responses",
             "xmltodict", "py-partiql-parser"}
HEADER = """\
# Exact versions the images install (pip -c): the set the project's tests pass with, on Python 3.11.
# Regenerate after changing pyproject.toml:  python -m infra.lock > infra/docker/constraints.txt
# torch is pinned without a local label, so the CPU wheel (+cpu) and the CUDA wheel (+cu128) both satisfy it."""


def constraints(freeze: str) -> list[str]:
    out = []
    for line in freeze.splitlines():
        name, sep, version = line.partition("==")
        if not sep or re.sub(r"[-_.]+", "-", name.lower()) in TEST_ONLY:
            continue
        out.append(f"{name}=={version.split('+')[0] if name.lower() == 'torch' else version}")
    return out


def main() -> int:
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout
    print(HEADER)
    print("\n".join(constraints(freeze)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
