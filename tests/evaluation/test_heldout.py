"""`python -m evaluation.heldout --which {start,latest-rl}` (the flow runs it in the background): without the checkpoint it
names it is a one-line error that says what to run first, never an evaluation of something else. The path that
evaluates and is reused by the evaluate stage runs in the front-door test (tests/flows/test_front_doors.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.heldout import heldout
from vtg.config import load_config
from vtg.errors import VTGError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("which, what", [("start", r"no RL start chosen yet \(run `python -m evaluation.select` first\)"),
                                         ("latest-rl", r"no complete RL checkpoint yet \(run `python -m training.rl`")])
def test_without_the_checkpoint_it_says_what_to_run(tmp_path, which, what):
    overrides = [f"evaluate.select_dir={tmp_path / 'select'}", f"rl.out_dir={tmp_path / 'rl'}"]
    with pytest.raises(VTGError, match=what):
        heldout(load_config(REPO / "params.yaml", None, overrides), which)
    r = subprocess.run([sys.executable, "-m", "evaluation.heldout", "--which", which, "--params", str(REPO / "params.yaml"),
                        *overrides], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "no RL start chosen yet" in r.stderr if which == "start" else "no complete RL checkpoint" in r.stderr
