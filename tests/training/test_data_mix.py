"""`train.data.mix` (issue 41 item 1): grounding shards and a general-task suite interleaved by weight, per stream
position from a seeded generator. The realised shares match the weights; the counts reach the log (MLflow) and
meta.json; a mixed run stopped and resumed is bit-exact, at world size 1 and 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from support.train_fixtures import REPO_ROOT, train_config

from training.data import ErrorLog, ShardStream, StreamSpec, resolve_urls
from training.sft import train
from vtg.checkpoints import read_checkpoint_meta
from vtg.errors import VTGError
from vtg.model.modeling import load_model_and_tokenizer, resolve_base
from vtg.model.processing import VisionParams

COLOURS = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0), "white": (255, 255, 255)}


def write_suite(root: Path, n: int = 12) -> Path:
    """A general-task suite of solid-colour images ("What colour is the picture?")."""
    import cv2

    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        name = list(COLOURS)[i % len(COLOURS)]
        image = root / f"img{i}.png"
        cv2.imwrite(str(image), np.full((56, 56, 3), COLOURS[name], dtype=np.uint8))
        lines.append(json.dumps({"id": f"c{i}", "task": "colour", "question": "What colour is the picture?",
                                 "answer": name, "choices": list(COLOURS), "image": str(image)}))
    path = root / "suite.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return write_suite(tmp_path_factory.mktemp("suite"))


def _mix(suite: Path, general: float = 0.2, sources: tuple[str, ...] = ()) -> str:
    return ("train.data.mix=" + json.dumps([{"name": "grounding", "weight": 1 - general, "sources": list(sources)},
                                            {"name": "colours", "weight": general, "suite": str(suite)}]))


def _stream(shards_dir: Path, suite: Path, seed: int = 0, general: float = 0.2, sources=()) -> ShardStream:
    model, tokenizer = load_model_and_tokenizer(resolve_base("tiny"))
    spec = StreamSpec(urls=tuple(resolve_urls(str(shards_dir), "train")), seed=seed, shuffle_buffer=16,
                      micro_batch_size=4, mix=(("grounding", 1 - general, "", tuple(sources)),
                                               ("colours", general, str(suite), ())))
    return ShardStream(spec, tokenizer, VisionParams.from_model(model))


def _names(stream: ShardStream, batches: int) -> list[str]:
    return [ex.get("mix") for b in islice(stream.raw_batches(ErrorLog()), batches) for ex in b]


def test_realised_shares_match_the_weights_and_the_mix_is_deterministic(shards_dir, suite):
    names = _names(_stream(shards_dir, suite), 150)  # 600 examples
    share = Counter(names)["colours"] / len(names)
    assert len(names) == 600 and set(names) == {"grounding", "colours"}
    assert abs(share - 0.2) < 0.05, share  # 3 binomial sd at n=600
    assert _names(_stream(shards_dir, suite), 25) == names[:100]  # same seed, same stream
    assert _names(_stream(shards_dir, suite, seed=1), 25) != names[:100]
    half = Counter(_names(_stream(shards_dir, suite, general=0.5), 150))
    assert abs(half["colours"] / 600 - 0.5) < 0.065
    # grounding restricted to declared sources: the fixture's own source id keeps everything
    assert _names(_stream(shards_dir, suite, sources=("fixture",)), 25) == names[:100]


def test_a_grounding_source_the_shards_do_not_hold_is_refused(shards_dir, suite, tmp_path):
    cfg = train_config(shards_dir, tmp_path / "ck", _mix(suite, sources=("another-set",)))
    with pytest.raises(VTGError, match=r"selects sources \['another-set'\], but the shards .* have no manifest"):
        train(cfg)  # the fixture shards have no manifest: nothing says which sources they hold
    from training.mix import check_mix_sources
    from vtg.config import load_config

    mix = load_config(REPO_ROOT / "params.yaml", None, [_mix(suite, sources=("another-set",))]).train.data.mix
    rows = [{"source": "fixture", "licence": "CC0-1.0", "queries": 48}]
    with pytest.raises(VTGError, match=r"sources \['another-set'\] are not in the train shards \(they hold fixture\)"):
        check_mix_sources(mix, rows, "data/shards", "train")
    check_mix_sources(load_config(REPO_ROOT / "params.yaml", None, [_mix(suite, sources=("fixture",))])
                      .train.data.mix, rows, "data/shards", "train")


def test_the_general_items_are_encoded_with_their_answer_as_the_only_target(shards_dir, suite):
    stream = _stream(shards_dir, suite, general=0.5)
    raw = [ex for b in islice(stream.raw_batches(ErrorLog()), 10) for ex in b if ex["mix"] == "colours"]
    encoded = stream.encode(raw[:4], ErrorLog())
    tok = stream.tokenizer
    for ex, enc in zip(raw[:4], encoded, strict=True):
        target = [t for t, lab in zip(enc["input_ids"].tolist(), enc["labels"].tolist(), strict=True) if lab != -100]
        assert tok.decode(target, skip_special_tokens=True).strip() == ex["answer"] and enc["mix"] == "colours"


def test_a_suite_that_does_not_exist_stops_the_run_before_step_one(shards_dir, tmp_path):
    cfg = train_config(shards_dir, tmp_path / "ck", _mix(tmp_path / "missing.jsonl"))
    with pytest.raises(VTGError, match="suite .*missing.jsonl does not exist"):
        train(cfg)


def test_preflight_counts_the_longest_general_item(shards_dir, suite, tmp_path):
    from training.preflight import preflight

    cfg = train_config(shards_dir, tmp_path / "ck", _mix(suite), "train.data.max_seq_len=64")
    report = preflight(cfg)
    assert any("longest general-task item of train.data.mix (colours:c" in p for p in report.problems), report.problems
    assert not any("general-task" in p for p in preflight(train_config(shards_dir, tmp_path / "ck", _mix(suite)))
                   .problems)


def test_mix_config_is_checked():
    from vtg.config import ConfigError, load_config

    for bad, why in ((['{name: a, weight: 1, suite: s.jsonl}'], "at least one grounding source"),
                     (['{name: a, weight: 1}', '{name: a, weight: 1, suite: s}'], "unique"),
                     (['{name: a, weight: 0}'], "greater than 0")):
        with pytest.raises(ConfigError, match=why):
            load_config(REPO_ROOT / "params.yaml", None, [f"train.data.mix=[{', '.join(bad)}]"])


def test_suite_taught_replays_what_the_base_was_taught_and_goes_where_nothing_was(suite, tmp_path):
    """The default mix's `suite: taught` is `train.teach.suite` for a tiny base that is taught; for a real base,
    no teaching steps or no suite file the entry goes, and a lone unfiltered grounding source is no mix."""
    from vtg.config import load_config

    taught = ["train.data.mix=[{name: grounding, weight: 0.9}, {name: general, weight: 0.1, suite: taught}]"]
    cfg = load_config(REPO_ROOT / "params.yaml", None, [f"train.teach.suite={suite}"])
    from vtg.config.train import DataConfig

    shipped = [(m.name, m.weight, m.suite) for m in DataConfig().mix]  # params.yaml is rendered from the classes
    assert [(m.name, m.weight, m.suite) for m in cfg.train.data.mix] == shipped
    assert [(n, s) for n, _, s in shipped] == [("grounding", ""), ("general", "taught")]
    assert [(m.name, m.suite) for m in cfg.train.mix_sources()] == [("grounding", ""), ("general", str(suite))]
    for why in ("train.teach.steps=0", "train.model.base=Qwen/Qwen2.5-VL-3B-Instruct",
                f"train.teach.suite={tmp_path / 'none.jsonl'}"):
        cfg = load_config(REPO_ROOT / "params.yaml", None, [f"train.teach.suite={suite}", *taught, why])
        assert cfg.train.mix_sources() == [], why
    kept = load_config(REPO_ROOT / "params.yaml", None, [
        "train.teach.steps=0", "train.data.mix=[{name: a, weight: 1, sources: [x]}, {name: g, weight: 1, suite: taught}]"])
    assert [m.name for m in kept.train.mix_sources()] == ["a"]


@pytest.mark.slow
def test_a_mixed_run_counts_its_sources_and_resumes_bit_exact(shards_dir, suite, tmp_path):
    """World size 1: the counts per source in meta.json, the summary and MLflow; stopped after step 2 and
    resumed, the losses and the counts are the uninterrupted run's."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [_mix(suite, 0.25), "train.max_steps=6", "train.save_every=2", "tracking.enabled=true",
              f"tracking.tracking_uri={uri}", f"tracking.artifacts_dir={tmp_path / 'art'}"]
    straight = train(train_config(shards_dir, tmp_path / "a", *common))
    mix = straight["data_mix"]
    assert sum(mix["counts"].values()) == straight["samples_seen"] == 6 * 4
    assert mix["counts"]["colours"] > 0 and mix["weights"] == {"grounding": 0.75, "colours": 0.25}
    assert read_checkpoint_meta(tmp_path / "a" / "latest")["data_mix"] == mix
    from flows.lineage import describe_mix

    line = describe_mix(mix)  # what `python -m flows.lineage <checkpoint>` prints under "trained on"
    assert line.startswith(f"grounding {mix['counts']['grounding']} (") and f"colours {mix['counts']['colours']} (" in line
    client = mlflow.tracking.MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("vtg-posttrain").experiment_id])[0]
    shares = [m.value for m in client.get_metric_history(run.info.run_id, "data/mix/colours")]
    assert len(shares) == 6 and abs(np.mean(shares) - mix["shares"]["colours"]) < 1e-9

    cfg = train_config(shards_dir, tmp_path / "b", *common[:3], "tracking.enabled=false")
    first = train(cfg, stop_after=2)
    assert first["step"] == 2
    resumed = train(cfg)
    assert resumed["losses"] == straight["losses"] and resumed["data_mix"] == mix


@pytest.mark.slow
def test_a_mixed_run_resumes_bit_exact_at_world_size_2(shards_dir, suite, tmp_path):
    """torchrun, two ranks (gloo): each rank mixes its own part of the stream; the run resumed from its step-3
    checkpoint gives the straight run's losses and counts."""
    env = dict(os.environ, PYTHONPATH=f"{REPO_ROOT}:{REPO_ROOT / 'tests' / 'training'}", OMP_NUM_THREADS="1",
               VTG_TEST_NAN_CALL="0")
    common = [f"train.shards_dir={shards_dir}", "train.micro_batch_size=4", "train.max_steps=6",
              "train.save_every=3", "train.log_every=1", "train.progress=false", "train.data.num_workers=0",
              "train.data.shuffle_buffer=16", "tracking.enabled=false", "train.teach.steps=0", _mix(suite, 0.25)]

    def run(out: Path, summary: Path, *extra: str) -> dict:
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2",
               str(REPO_ROOT / "tests" / "training" / "ws2_entry.py"), "--summary", str(summary),
               f"train.out_dir={out}", *common, *extra]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(summary.read_text())

    s = run(tmp_path / "a", tmp_path / "a.json")
    assert sum(s["data_mix"]["counts"].values()) == 6 * 4 * 2 and s["data_mix"]["counts"]["colours"] > 0
    r = run(tmp_path / "b", tmp_path / "b.json", f"train.resume={tmp_path / 'a' / 'step-000003'}")
    assert r["data_mix"] == s["data_mix"]
    loss = [line for line in (tmp_path / "a_loss.csv").read_text().splitlines()]
    assert [line for line in (tmp_path / "b_loss.csv").read_text().splitlines()] == loss


def test_a_changed_taught_base_starts_a_new_trajectory(shards_dir, suite, tmp_path, monkeypatch):
    """The SFT run key covers the build of a tiny base (the taught base's cache name: teaching version, suite,
    settings): the same base resumes, a changed one moves the old root aside instead of resuming from weights
    trained on the old base (seen when the teaching changed under a finished run)."""
    from vtg.model import teach

    common = [f"train.teach.suite={suite}", "train.teach.steps=2", "train.data.mix=[]"]
    train(train_config(shards_dir, tmp_path / "ck", *common, "train.max_steps=2"))
    key = read_checkpoint_meta(tmp_path / "ck" / "latest")["train_hash"]
    train(train_config(shards_dir, tmp_path / "ck", *common, "train.max_steps=4"))  # the same base: resumes
    assert read_checkpoint_meta(tmp_path / "ck" / "latest")["train_hash"] == key
    assert not list(tmp_path.glob("ck-superseded-*"))
    monkeypatch.setattr(teach, "TEACH_VERSION", "changed")
    train(train_config(shards_dir, tmp_path / "ck", *common, "train.max_steps=4"))
    assert read_checkpoint_meta(tmp_path / "ck" / "latest")["train_hash"] != key
    assert len(list(tmp_path.glob("ck-superseded-*"))) == 1
