"""The embedded default (`python -m flows`, ephemeral Prefect API) on tiny stand-in stages: a failure injected
after preprocessing, `prefect flow-run retry`, finished steps not redone; SFT -> RL -> evaluation, every SFT and
RL checkpoint evaluated in a separate process while they run; shards versioned with DVC; the lineage chains of
the resulting SFT and RL checkpoints back to the raw data."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support.flowkit import (
    BIN,
    PY,
    STANDIN_OVERRIDES,
    git,
    project_env,
    read_jsonl,
    set_params,
    shadow_stages,
    stage_calls,
)

from flows.pipeline import ENV_FAIL_FLAG


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.mark.slow
def test_failure_after_preprocess_then_retry_skips_finished_steps(project: Path):
    shadow_stages(project)  # the code folders dvc.yaml depends on (dvc commit hashes them)
    set_params(project, **{"corpus.n_videos": 10})  # data params in params.yaml: the shards go into dvc.lock
    git(project, "add", "-A")
    git(project, "commit", "-qm", "project")
    flag = project / "fail.flag"
    flag.touch()
    env = project_env(project, **{ENV_FAIL_FLAG: str(flag), "STANDIN_STEP_S": "0.5"})
    overrides = [*STANDIN_OVERRIDES, "train.max_steps=8"]

    first = run([PY, "-m", "flows", *overrides], project, env)
    assert first.returncode == 2, first.stdout[-3000:] + first.stderr[-3000:]
    err = [line for line in first.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith("error: post-training flow run") and "injected failure" in err[0]
    assert stage_calls(project) == ["corpus", "ingest", "annotate", "preprocess"]
    retry_cmd = re.search(r"retry it: (prefect flow-run retry \S+ --entrypoint \S+)", first.stderr).group(1).split()

    flag.unlink()
    second = run([str(BIN / "prefect"), *retry_cmd[1:]], project, env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # nothing before `train` again: dvc.lock records them as done; SFT, then RL, then the evaluate stage
    assert stage_calls(project) == ["corpus", "ingest", "annotate", "preprocess", "train", "select", "rl", "evaluate-cli"]
    log = second.stdout + second.stderr
    assert log.count("Cached('up to date (dvc.lock)'") == 4
    # the stand-in evaluate stage would never read held-out results stored ahead by `evaluation.heldout`: none start
    # (the front-door test checks that the shipped stage's do, and that it reuses them)
    assert "[heldout-" not in log and not list((project / "reports/orchestration").glob("heldout_*.log"))

    report = (project / "reports/pipeline_report.md").read_text()
    assert "eval_mode | `embedded`" in report and "Held-out test metrics" in report
    sft_root, rl_root = (project / "checkpoints/sft").resolve(), (project / "checkpoints/rl").resolve()
    assert "| rl | run `" in report and "from `" in report and "2 steps -> `" in report
    evals = read_jsonl(project / "reports/orchestration/checkpoint_evals.jsonl")
    val = [e for e in evals if e["split"] == "val"]
    sft = [e for e in val if Path(e["checkpoint_dir"]).parent == sft_root]
    rl = [e for e in val if Path(e["checkpoint_dir"]).parent == rl_root]
    assert [e["step"] for e in sft] == [2, 4, 6, 8] and [e["step"] for e in rl] == [1, 2]  # one evaluator, both
    assert all(e["metrics"]["r1@0.5"] > 0 for e in val) and len(val) == 6
    saved = {e["step"]: e["saved_at"] for e in sft}
    assert sft[0]["started_at"] < saved[8], "evaluation of the first checkpoint did not overlap training"
    assert max(e["saved_at"] for e in sft) < min(e["saved_at"] for e in rl)  # RL after SFT
    best = json.loads((project / "reports/eval/best.json").read_text())  # the evaluate stage saw both roots
    assert best["checkpoint"].startswith("../../checkpoints/rl/")

    lock = (project / "dvc.lock").read_text()  # shards committed to dvc.lock and pushed to the local remote
    assert "data/shards" in lock and any((project / "dvc_remote").rglob("*"))

    lineage = run([PY, "-m", "flows.lineage", "checkpoints/sft/latest", "--json"], project, env, timeout=120)
    assert lineage.returncode == 0, lineage.stderr
    chain = json.loads(lineage.stdout)
    assert chain["source_digest"] and chain["shard_digest"] and chain["dvc_md5"] not in (None, "-")
    assert chain["train_run"] and chain["train_params"]["lr"] == "0.003" and chain["step"] == 8
    assert chain["flow_run"] in first.stderr and chain["preprocess"]["preprocess.num_frames"]
    assert {e["split"] for e in chain["evals"]} == {"val"} and chain["stage"] == "sft"
    # An RL checkpoint: its RL run and evaluations, then its SFT parent, on to the data version and the raw data.
    lineage = run([PY, "-m", "flows.lineage", "reports/eval/best.json", "--json"], project, env, timeout=120)
    assert lineage.returncode == 0, lineage.stderr
    rl_chain = json.loads(lineage.stdout)
    assert rl_chain["stage"] == "rl" and rl_chain["step"] == 2 and rl_chain["rl_run"]
    assert Path(rl_chain["parent_checkpoint"]).resolve() == sft_root / "step-000008" and rl_chain["parent_step"] == 8
    for key in ("source_digest", "shard_digest", "dvc_md5", "train_run", "train_params", "flow_run", "preprocess"):
        assert rl_chain[key] == chain[key], key
    assert {e["split"] for e in rl_chain["evals"]} == {"val", "test"}  # the best: evaluated on test too
    text = run([PY, "-m", "flows.lineage", "checkpoints/rl/latest"], project, env, timeout=120).stdout
    assert f"-> SFT checkpoint {rl_chain['parent_checkpoint']}  step 8" in text and chain["source_digest"] in text

    # A code dependency dvc.yaml lists (the answer format) changed: the flow reruns exactly the stages that
    # depend on it, as `dvc repro` would: annotate (its verifier reads answers; its output is the same bytes, so
    # preprocess stays `Cached` with corpus and ingest), then train, rl and evaluate. (That a flow run on a finished project
    # skips every stage is the front-door test's, on the real stages.)
    with (project / "vtg" / "answer.py").open("a") as f:
        f.write("\n# answer format v2\n")
    before = len(stage_calls(project))
    third = run([PY, "-m", "flows", *overrides], project, env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert stage_calls(project)[before:] == ["annotate", "train", "select", "rl", "evaluate-cli"]
    assert (third.stdout + third.stderr).count("Cached('up to date (dvc.lock)'") == 3
