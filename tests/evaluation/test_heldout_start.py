"""`python -m evaluation.select --heldout-start` (the flow runs it beside RL): without a chosen start it is a one-line
error that says what to run first, never an evaluation of something else. The path that evaluates and is reused by
the evaluate stage runs in the front-door test (tests/flows/test_front_doors.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.select import heldout_start
from vtg.config import load_config
from vtg.errors import VTGError

REPO = Path(__file__).resolve().parents[2]


def test_without_a_chosen_start_it_says_to_run_the_select_stage(tmp_path):
    cfg = load_config(REPO / "params.yaml", None, [f"evaluate.select_dir={tmp_path / 'select'}"])
    with pytest.raises(VTGError, match=r"no RL start chosen yet \(run `python -m evaluation.select` first\)"):
        heldout_start(cfg)
    r = subprocess.run([sys.executable, "-m", "evaluation.select", "--params", str(REPO / "params.yaml"),
                        f"evaluate.select_dir={tmp_path / 'select'}", "--heldout-start"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no RL start chosen yet" in r.stderr, r.stderr
