"""The GRPO loop on real tiny models and fixture shards: log-prob parity with `generate`, exact resume, the
stage's outputs and checkpoint contract, and that RL improves the policy's reward."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
import torch
from support.train_fixtures import REPO_ROOT, train_config, write_fixture_shards

from vtg.errors import VTGError

SFT_STEPS = 60


def _cfg(tmp: Path, shards: Path, sft: Path, *overrides: str):
    return train_config(shards, sft, f"evaluate.shards_dir={shards}", f"evaluate.out_dir={tmp / 'eval'}",
                        f"evaluate.store_dir={tmp / 'store'}", f"rl.out_dir={tmp / 'rl'}",
                        f"rl.report_dir={tmp / 'rlrep'}", "rl.queries_per_step=4", "rl.group_size=4",
                        "rl.log_every=1", "rl.progress=false", "rl.kl_every=1", "rl.save_every=2",
                        f"train.max_steps={SFT_STEPS}", "train.save_every=1000", "train.micro_batch_size=8",
                        *overrides)


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """Fixture shards and an SFT checkpoint that answers in the span format (60 steps, ~15 s)."""
    from training.sft import train

    tmp = tmp_path_factory.mktemp("rl_sft")
    shards = write_fixture_shards(tmp / "shards", n_train=24, n_val=6, shards_per_split=2)
    cfg = _cfg(tmp, shards, tmp / "sft")
    train(cfg)
    return tmp, shards, tmp / "sft"


def test_teacher_forced_logprobs_match_generate(sft):
    """The update scores exactly the distribution the rollout sampled from (temperature, suppressed vision
    tokens), token for token."""
    from training.rl import algo
    from training.rl.rollout import encode_prompts, sample, teacher_forced_logits, vision_token_ids
    from training.rl.start import load_train_queries
    from vtg import checkpoints
    from vtg.model.modeling import load_model_and_tokenizer
    from vtg.model.processing import VisionParams

    tmp, shards, sft_dir = sft
    cfg = _cfg(tmp, shards, sft_dir)
    model, tok = load_model_and_tokenizer(checkpoints.export_dir(checkpoints.latest_checkpoint(sft_dir)),
                                          device="cpu", dtype=torch.float32, trainable=True)
    examples = load_train_queries(cfg)[:3]
    encoded = encode_prompts(tok, examples, 4, VisionParams.from_model_config(model.config))
    captured = {}
    generate = model.generate

    def generate_with_scores(**kw):
        out = generate(**kw, output_scores=True, return_dict_in_generate=True)
        captured["scores"] = out.scores
        return out.sequences

    model.generate = generate_with_scores
    torch.manual_seed(0)
    roll = sample(model, tok, encoded, temperature=0.7, top_p=1.0, max_new_tokens=12, device="cpu",
                  dtype=torch.float32)
    masked = vision_token_ids(model.config)
    assert masked and not any(t in masked for t in roll.completions.flatten().tolist())
    gen_logp = torch.stack([torch.log_softmax(s.float(), -1) for s in captured["scores"]], 1)
    gen_logp = gen_logp.gather(-1, roll.completions.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        logits = teacher_forced_logits(lambda b: model(**b), tok, roll, slice(0, len(encoded)), "cpu",
                                       torch.float32, 0.7, masked)
    tf_logp = algo.token_logprobs(logits, roll.completions)
    m = roll.mask.bool()
    assert m.sum() > 0
    assert torch.allclose(tf_logp[m], gen_logp[m], atol=1e-4), (tf_logp[m] - gen_logp[m]).abs().max()
    # micro-batches of other widths (re-collated prompts) give the same numbers
    with torch.no_grad():
        part = teacher_forced_logits(lambda b: model(**b), tok, roll, slice(4, 8), "cpu", torch.float32, 0.7, masked)
    assert torch.allclose(algo.token_logprobs(part, roll.completions[4:8]), tf_logp[4:8], atol=1e-5)


def _history(rep: Path) -> list[dict]:
    with (rep / "steps.csv").open() as f:
        return list(csv.DictReader(f))


def _float(cell: str) -> float:
    return float(cell) if cell != "" else math.nan  # steps.csv writes an unmeasured (NaN) value as ""


def assert_same_steps(a: list[dict], b: list[dict], kl_every: int) -> None:
    """Two steps.csv histories are bit-equal in every metric that does not time anything (`*_s`): the cells parsed
    as floats and compared with ==. NaN is accepted only in `kl`, only on the steps where it is not measured by
    design (kl_beta 0: every `kl_every`-th step), and only where both runs have it; every other cell is finite."""
    from training.rl.grpo import STEP_METRICS

    keys = ["step", *(k for k in STEP_METRICS if not k.endswith("_s"))]
    assert len(a) == len(b) and a
    for ra, rb in zip(a, b, strict=True):
        step = int(ra["step"])
        for k in keys:
            x, y = _float(ra[k]), _float(rb[k])
            if k == "kl" and (kl_every == 0 or step % kl_every):
                assert math.isnan(x) and math.isnan(y), (step, k, x, y)  # not measured on this step, in either run
                continue
            assert math.isfinite(x) and math.isfinite(y), (step, k, x, y)
            assert x == y, (step, k, x, y)


@pytest.mark.slow
def test_rl_resumes_exactly_and_writes_the_checkpoint_contract(sft, tmp_path):
    """Stop after step 2, resume: steps 3-4 give bit-equal rewards, losses and weights to an uninterrupted run.
    Checkpoints follow the SFT contract and name their parent; steps.csv and summary.json are written."""
    from safetensors.torch import load_file

    from training.rl.grpo import run_rl
    from vtg import checkpoints

    _, shards, sft_dir = sft
    runs = {}
    for name, stops in (("straight", [None]), ("resumed", [2, None])):
        out = tmp_path / name
        cfg = _cfg(out, shards, sft_dir, "rl.max_steps=4", "rl.resume=auto", "rl.init=latest",
                   f"rl.out_dir={out / 'rl'}", f"rl.report_dir={out / 'rlrep'}")
        for stop in stops:
            summary = run_rl(cfg, stop_after=stop)
        runs[name] = (out, summary)
    (a, sa), (b, sb) = runs["straight"], runs["resumed"]
    assert sb["steps_run"] == 2 and sa["steps_run"] == 4
    ha, hb = _history(a / "rlrep"), _history(b / "rlrep")
    assert [int(r["step"]) for r in ha] == [1, 2, 3, 4]
    assert_same_steps(ha, hb, kl_every=1)  # rl.kl_every=1 (`_cfg`): kl measured, so finite, on every step
    assert all(0 <= float(r[k]) < 1 for r in ha for k in ("prefill_padding_frac", "update_padding_frac"))
    assert any(float(r["reward_std"]) > 0 for r in ha)  # a real signal, not all-zero rewards
    wa = load_file(checkpoints.export_dir(a / "rl" / "step-000004") / "model.safetensors")
    wb = load_file(checkpoints.export_dir(b / "rl" / "step-000004") / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    meta = checkpoints.read_checkpoint_meta(a / "rl" / "step-000004", verify=True)
    assert meta["stage"] == "rl" and meta["parent_step"] == SFT_STEPS
    assert not Path(meta["parent_checkpoint"]).is_absolute()  # relative to the checkpoint: portable
    assert checkpoints.parent_checkpoint(a / "rl" / "step-000004") == checkpoints.latest_checkpoint(sft_dir).resolve()
    assert checkpoints.latest_checkpoint(a / "rl").name == "step-000004"
    summary = json.loads((a / "rlrep" / "summary.json").read_text())
    assert summary["difficulty"]["scored"] == 48 and summary["difficulty"]["kept"] <= 48
    # the RL export loads with plain from_pretrained and evaluates like any checkpoint
    from evaluation.api import evaluate_checkpoint

    cfg = _cfg(a, shards, sft_dir, f"rl.out_dir={a / 'rl'}")
    res = evaluate_checkpoint(a / "rl" / "step-000004", "val", cfg, refresh=False)
    assert res.result["summary"]["model"]["n"] == 12


@pytest.mark.slow
def test_rl_raises_the_mean_reward(sft, tmp_path):
    """A short GRPO run on the fixture data: the mean reward of the last steps beats the first steps'."""
    from training.rl.grpo import run_rl

    _, shards, sft_dir = sft
    cfg = _cfg(tmp_path, shards, sft_dir, "rl.max_steps=40", "rl.lr=1e-3", "rl.queries_per_step=8",
               "rl.group_size=8", "rl.kl_every=10", "rl.save_every=1000", "rl.init=latest")
    h = run_rl(cfg)["history"]
    first = sum(r["reward_mean"] for r in h[:10]) / 10
    last = sum(r["reward_mean"] for r in h[-10:]) / 10
    assert last > first + 0.03, (first, last)


@pytest.mark.slow
def test_rl_world_size_2_zero3_torchrun(sft, tmp_path):
    """`torchrun -m training.rl` at world size 2 (gloo) under ZeRO-3: generate through partitioned parameters,
    each rank its share of the queries, one checkpoint with both ranks' state, and an exact resume: stopped after
    step 2 and resumed to step 3, the run's steps.csv and step-3 export are bit-equal to an uninterrupted run's."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from vtg import checkpoints

    _, shards, sft_dir = sft
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    args = [f"train.shards_dir={shards}", f"train.out_dir={sft_dir}", f"evaluate.shards_dir={shards}",
            "rl.init=latest", "rl.num_gpus=2", "rl.zero_stage=3", "rl.queries_per_step=4", "rl.group_size=4",
            "rl.max_steps=3", "rl.save_every=2", "rl.log_every=1", "rl.kl_every=2", "rl.progress=false",
            "tracking.enabled=false"]

    def run(root: Path, *extra):
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2",
               "-m", "training.rl", *args, f"rl.out_dir={root / 'rl'}", f"rl.report_dir={root / 'rep'}", *extra]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    run(tmp_path, "--stop-after", "2")
    proc = run(tmp_path)
    assert "resumed RL from" in proc.stderr
    meta = checkpoints.read_checkpoint_meta(tmp_path / "rl" / "step-000003", verify=True)
    assert meta["world_size"] == 2 and meta["stage"] == "rl"
    engine = checkpoints.engine_dir(tmp_path / "rl" / "step-000003")
    assert {p.name for p in engine.glob("rank-*.json")} == {"rank-0.json", "rank-1.json"}
    rows = _history(tmp_path / "rep")
    assert [int(r["step"]) for r in rows] == [1, 2, 3]

    straight = tmp_path / "straight"
    run(straight)
    # rl.kl_every=2: kl measured (finite) on step 2, NaN by design on steps 1 and 3, in both runs
    assert_same_steps(_history(straight / "rep"), rows, kl_every=2)
    a = load_file(checkpoints.export_dir(straight / "rl" / "step-000003") / "model.safetensors")
    b = load_file(checkpoints.export_dir(tmp_path / "rl" / "step-000003") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rl_off_leaves_an_empty_root_and_moves_old_checkpoints_aside(tmp_path):
    """orchestration.rl=false: no RL checkpoints survive in the root (selection must not see a stale run), none
    are deleted, and the summary says where they went."""
    from training.rl.grpo import run_rl

    old = tmp_path / "rl" / "step-000002"
    (old / "hf").mkdir(parents=True)
    (old / "meta.json").write_text("{}")
    cfg = _cfg(tmp_path, tmp_path / "shards", tmp_path / "sft", "orchestration.rl=false")
    summary = run_rl(cfg)
    assert summary["enabled"] is False and list((tmp_path / "rl").iterdir()) == []
    moved = Path(summary["moved_aside"])
    assert (moved / "step-000002" / "meta.json").is_file()
    assert json.loads((tmp_path / "rlrep" / "summary.json").read_text())["enabled"] is False


def test_rl_from_a_checkpoint_that_cannot_answer_warns_and_says_so(tmp_path, caplog):
    """Issue 21 case 6: RL from a start checkpoint whose every answer fails to parse used to run all its steps at
    reward 0 and exit 0 without a word. Now each such step warns, the run ends with a warning, and the summary
    counts the steps without a learning signal."""
    import logging

    from training.rl.grpo import run_rl
    from training.sft import train

    shards = write_fixture_shards(tmp_path / "shards", n_train=8, n_val=4, shards_per_split=1)
    cfg = _cfg(tmp_path, shards, tmp_path / "sft", "train.max_steps=1", "train.lr=1e-6", "rl.max_steps=2",
               "rl.queries_per_step=2", "rl.group_size=2", "rl.save_every=2", "rl.init=latest",
               "rl.max_queries=8")
    train(cfg)  # one step at lr 1e-6: the random-init tiny model, which never writes a span
    with caplog.at_level(logging.WARNING, logger="training.rl"):
        summary = run_rl(cfg)
    assert summary["steps_all_unparsed"] == 2 and summary["steps_without_signal"] == 2
    text = caplog.text
    assert text.count("every answer failed to parse") == 2 and "no RL step had a learning signal" in text
    assert json.loads((tmp_path / "rlrep" / "summary.json").read_text())["steps_without_signal"] == 2


def test_rl_under_fsdp2_is_refused_before_it_loads_anything(tmp_path):
    """FSDP2 cannot run generate's vision pass over sharded parameters (measured: a mixed Tensor/DTensor
    convolution on the first rollout): the stage says so at once, naming what to use."""
    from training.rl.grpo import run_rl

    cfg = _cfg(tmp_path, tmp_path / "shards", tmp_path / "sft", "engine.strategy=fsdp")
    with pytest.raises(VTGError, match=r"FSDP2 cannot run the RL stage yet .* engine.strategy=deepspeed"):
        run_rl(cfg)
    assert not list((tmp_path / "rl").glob("step-*"))
