"""`python -m training` in-process: summary files, resume or move aside, one-line user errors."""

import json

from support.train_fixtures import train_config  # noqa: F401  (registers the fixture helpers' path)

from training.__main__ import main
from vtg.cli_common import run_cli


def _args(shards_dir, out, *extra):
    return ["--summary", str(out / "summary.json"), f"train.shards_dir={shards_dir}", f"train.out_dir={out / 'ck'}",
            "train.micro_batch_size=4", "train.max_steps=3", "train.save_every=3", "train.progress=false",
            "train.data.num_workers=0", "train.data.sanity_examples=4", "tracking.enabled=false", *extra]


def test_cli_summary_resume_guard_and_errors(shards_dir, tmp_path, capsys, caplog):
    assert run_cli(main, _args(shards_dir, tmp_path)) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["step"] == 3 and summary["completed"] and summary["steps_per_s"] > 0
    rows = (tmp_path / "summary_loss.csv").read_text().splitlines()
    assert rows[0] == "step,loss" and [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]
    # Resuming the finished run with a longer schedule continues from step 3 ...
    assert run_cli(main, _args(shards_dir, tmp_path, "train.max_steps=4")) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["step"] == 4
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == ["step-000003", "step-000004"]
    # ... but not with other settings: that would mix two trajectories. It starts fresh and moves the old
    # checkpoints aside, intact, saying where.
    capsys.readouterr()
    assert run_cli(main, _args(shards_dir, tmp_path, "train.max_steps=2", "train.save_every=2", "train.lr=1e-4")) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["step"] == 2
    [aside] = tmp_path.glob("ck-superseded-*")
    assert sorted(p.name for p in aside.glob("step-*")) == ["step-000003", "step-000004"]
    assert str(aside) in caplog.text and "other train settings" in caplog.text
    assert run_cli(main, _args(shards_dir, tmp_path, "train.zero_stage=7")) == 2
    assert "zero_stage" in capsys.readouterr().err
    assert run_cli(main, ["train.shards_dir=/nonexistent", "tracking.enabled=false"]) == 2
    assert "no shards in /nonexistent/train" in capsys.readouterr().err
