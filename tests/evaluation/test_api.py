"""End to end: tiny checkpoints honouring training's contract, evaluated through the API and the CLI."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from support.eval_fixtures import make_checkpoint
from support.measured_settings import EVALUATE_MEASURED

from evaluation.__main__ import main
from evaluation.api import evaluate_checkpoint
from evaluation.store import load_result
from vtg.checkpoints import BEST_POINTER, export_dir, resolve_checkpoint
from vtg.cli_common import run_cli
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.harness import HarnessMismatch, card_digest
from vtg.lineage import TAG_CHECKPOINT, TAG_DATA_VERSION, TAG_STAGE, TAG_STEP, TAG_TRAIN_RUN
from vtg.selection import pick_best
from vtg.shards import data_version

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory, shards_dir):
    import mlflow

    tmp = tmp_path_factory.mktemp("eval_e2e")
    # MLflow puts a new experiment's artifacts in ./mlruns of the working directory (as `make run` does in a
    # project): here that is tmp, not the repository a test run starts in
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = PipelineConfig.model_validate({
        "evaluate": {"shards_dir": str(shards_dir), "out_dir": str(tmp / "reports/eval"),
                     "store_dir": str(tmp / "reports/eval_runs"), "batch_size": 3, "max_new_tokens": 12,
                     "device": "cpu", "report_samples": 4, **EVALUATE_MEASURED},
        "tracking": {"tracking_uri": uri, "experiment": "eval-test", "registered_model": "vtg-test"},
    })
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri, registry_uri=uri)
    train_run = client.create_run(client.create_experiment("train-test")).info.run_id
    root = tmp / "checkpoints" / "sft"
    ckpts = [make_checkpoint(root, 0, shards_dir, 0, train_run), make_checkpoint(root, 30, shards_dir, 30, train_run)]
    yield {"cfg": cfg, "client": client, "train_run": train_run, "root": root, "ckpts": ckpts, "tmp": tmp}
    mp.undo()


def _eval_runs(client) -> list:
    exp = client.get_experiment_by_name("eval-test")
    return client.search_runs([exp.experiment_id]) if exp else []


def _versions(client) -> list:
    return client.search_model_versions("name='vtg-test'")


def test_checkpoints_evaluated_end_to_end_with_baselines_report_and_registry(env):
    cfg, client = env["cfg"], env["client"]
    results = [evaluate_checkpoint(c, "val", cfg) for c in env["ckpts"]]
    for res, ckpt in zip(results, env["ckpts"]):
        r, s = res.result, res.result["summary"]
        assert not res.reused and r["step"] == int(ckpt.name.split("-")[1])
        assert s["counts"] == {"samples": 3, "queries": 4, "scored": 4, "skipped": {}}
        assert set(s["baselines"]) == {"prior", "blank"}
        for m in ("miou", "r1@0.3", "r1@0.5", "r1@0.7"):
            assert 0 <= s["model"][m] <= 1
            best_blind = max(b[m] for b in s["baselines"].values())
            assert s["visual_gain"][m] == pytest.approx(s["model"][m] - best_blind)
        assert s["model"]["eval_loss"] > 0 and 0 <= s["model"]["parse_failure_rate"] <= 1
        preds = [json.loads(line) for line in (res.entry_dir / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 4 and {"query", "gt", "raw", "pred", "iou", "blank_iou", "prior_iou"} <= set(preds[0])
        assert s["model"]["miou"] == pytest.approx(sum(p["iou"] for p in preds) / 4)
        html = res.report.read_text()
        images = re.findall(r'<img src="([^"]+)"', html)
        assert len(images) == 4 and all((res.entry_dir / img).stat().st_size > 1000 for img in images)
        run = client.get_run(r["mlflow_run_id"])
        assert str(env["tmp"]) in run.info.artifact_uri  # not the repository's mlruns/
        assert run.data.tags[TAG_STAGE] == "evaluate" and run.data.tags[TAG_TRAIN_RUN] == env["train_run"]
        assert run.data.tags[TAG_STEP] == str(r["step"]) and run.data.tags[TAG_CHECKPOINT] == str(ckpt)
        assert run.data.tags[TAG_DATA_VERSION] == data_version(env["cfg"].evaluate.shards_dir)
        assert run.data.metrics["eval/val/r1_at_0.7"] == s["model"]["r1@0.7"]
        # every metric carries its harness card and its interval: in the result, MLflow and the report
        card, ci = s["harness"], s["intervals"]
        assert card["protocol"] == "windowed" and card["data"]["queries"] == 4 and card["data"]["split"] == "val"
        assert card["decoding"] == {"strategy": "greedy", "max_new_tokens": 12}
        assert "{query}" in card["prompt"]["text"] and card["model"]["family"] == "qwen2_5_vl"
        assert card["frames"]["per_query"]["max"] >= card["frames"]["per_query"]["min"] > 0
        for m in ("miou", "r1@0.3", "r1@0.5", "r1@0.7"):
            lo, hi = ci["model"][m]
            assert lo <= s["model"][m] <= hi
            assert ci["visual_gain"][m]["delta"] == pytest.approx(s["visual_gain"][m])
        for extra in ("eval_loss", "parse_failure_rate"):  # not only the grounding metrics carry an interval
            lo, hi = ci["model"][extra]
            assert lo <= s["model"][extra] <= hi
        assert run.data.tags["vtg.harness"] == card_digest(card)
        assert run.data.metrics["eval/val/miou_ci_low"] == ci["model"]["miou"][0]
        assert "Harness card" in html and "95% CI" in html
    trained = results[1].metrics
    assert trained["parse_failure_rate"] < 1, "30 steps of training should teach the answer format"

    # The training run shows eval curves: one point per evaluated checkpoint, at its step.
    history = client.get_metric_history(env["train_run"], "eval/val/miou")
    assert sorted(m.step for m in history) == [0, 30]

    # Stage outputs: the last evaluated checkpoint, and the step curve over both.
    out = Path(cfg.evaluate.out_dir)
    published = json.loads((out / "metrics.json").read_text())
    assert published["step"] == 30 and published["harness"] == results[1].result["summary"]["harness"]
    assert published["intervals"]["model"]["miou"] == results[1].result["summary"]["intervals"]["model"]["miou"]
    rows = list(csv.DictReader((out / "steps.csv").open()))
    assert [int(r["step"]) for r in rows] == [0, 30] and "prior_r1@0.7" in rows[0]
    for f in ("report.html", "step_curve.png", "iou_hist.png", "timelines.png", "baselines.png", "predictions.jsonl"):
        assert (out / f).is_file()

    # Best checkpoint: by r1@0.7, then mIoU, then the later step.
    expected = max(results, key=lambda x: (x.metrics["r1@0.7"], x.metrics["miou"], x.result["step"]))
    version = client.get_model_version_by_alias("vtg-test", "best")
    assert version.tags[TAG_CHECKPOINT] == expected.result["checkpoint"]
    assert version.source == str(export_dir(expected.result["checkpoint"]))
    # the pointer lives in the evaluation's own outputs (a plain JSON file), not in the checkpoint root
    assert resolve_checkpoint(out / BEST_POINTER) == Path(expected.result["checkpoint"])
    assert not (env["root"] / "best").exists() and not (env["root"] / BEST_POINTER).exists()
    assert results[1].selection["best"] == expected.result["checkpoint"]


def test_second_call_reuses_the_stored_result(env):
    cfg, client = env["cfg"], env["client"]
    runs, versions = len(_eval_runs(client)), len(_versions(client))
    again = evaluate_checkpoint(env["root"] / "latest", "val", cfg)
    assert again.reused and again.result["checkpoint"] == str(env["ckpts"][1])
    stored = json.loads((again.entry_dir / "metrics.json").read_text())
    assert stored["checkpoint"] == "../../../../checkpoints/sft/step-000030"  # relative to the entry: portable
    assert again.result == load_result(again.entry_dir)  # read back absolute
    assert len(_eval_runs(client)) == runs and len(_versions(client)) == versions
    digest = json.loads(json.dumps(again.to_dict()))
    assert digest["reused"] and digest["model"] == again.metrics and "fit" not in digest["baselines"]["prior"]


@pytest.mark.parametrize("damage", ["half_written", "truncated_weights", "corrupt_meta"])
def test_corrupt_checkpoint_is_a_clear_error_and_registers_nothing(env, damage, capsys):
    cfg, client = env["cfg"], env["client"]
    runs, versions = len(_eval_runs(client)), len(_versions(client))
    bad = env["tmp"] / f"bad-{damage}" / "step-000040"
    shutil.copytree(env["ckpts"][0], bad)
    if damage == "half_written":
        (bad / "meta.json").unlink()
    elif damage == "truncated_weights":
        weights = next((bad / "hf").glob("*.safetensors"))
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        (bad / "meta.json").write_text('{"step": 40,')
    with pytest.raises(VTGError) as e:
        evaluate_checkpoint(bad, "val", cfg)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
    overrides = [f"evaluate.{k}={v}" for k, v in cfg.evaluate.model_dump().items() if k.endswith("_dir")]
    overrides.append(f"tracking.tracking_uri={cfg.tracking.tracking_uri}")
    assert run_cli(main, ["--checkpoint", str(bad), *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    assert len(_eval_runs(client)) == runs and len(_versions(client)) == versions
    assert not list(Path(cfg.evaluate.store_dir).glob("val/step-000040-*"))


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_adhoc_cli_moves_no_shared_result(env, capsys, tmp_path):
    """Issue 21 case 5: `python -m evaluation --checkpoint X evaluate.max_examples=...` is a side command. It used to
    move reports/eval/{best.json,metrics.json}, the registry alias and the training run's curve to its result."""
    cfg, client = env["cfg"], env["client"]
    out_dir = Path(cfg.evaluate.out_dir)
    before = (client.get_model_version_by_alias("vtg-test", "best").version, _digests(out_dir),
              {k: [(m.step, m.value) for m in client.get_metric_history(env["train_run"], k)]
               for k in ("eval/val/miou", "eval/test/miou")})
    assert (out_dir / "best.json").is_file() and before[2]["eval/val/miou"]  # the stage's results exist
    overrides = [f"evaluate.{k}={v}" for k, v in cfg.evaluate.model_dump().items()
                 if k in ("shards_dir", "out_dir", "store_dir", "batch_size", "max_new_tokens", "device")]
    overrides += [f"tracking.{k}={v}" for k, v in cfg.tracking.model_dump().items()]
    overrides = ["--params", str(Path(__file__).resolve().parents[2] / "params.yaml"), *overrides]  # cwd: tmp
    runs = len(_eval_runs(client))
    # a smaller val set than the stage's (other settings: a new result), then every checkpoint on test
    assert run_cli(main, ["--checkpoint", str(env["ckpts"][0]), "--split", "val", "--out", str(tmp_path / "adhoc"),
                          *overrides, "evaluate.max_examples=2"]) == 0
    assert run_cli(main, ["--checkpoint", str(env["root"]), "--all", "--split", "test", *overrides]) == 0
    out = capsys.readouterr().out
    assert "step 0) on val" in out and "step 0) on test" in out and "step 30) on test" in out
    assert "prior (blind)" in out and "visual gain" in out and "are unchanged" in out
    after = (client.get_model_version_by_alias("vtg-test", "best").version, _digests(out_dir),
             {k: [(m.step, m.value) for m in client.get_metric_history(env["train_run"], k)]
              for k in ("eval/val/miou", "eval/test/miou")})
    assert after == before  # pointer, DVC metric, steps.csv, report, alias, training-run curves: all as they were
    assert len(_eval_runs(client)) == runs + 3  # each ad-hoc result has its own MLflow run
    [copy] = (tmp_path / "adhoc").iterdir()
    metrics = json.loads((copy / "metrics.json").read_text())
    assert metrics["split"] == "val" and metrics["step"] == 0 and metrics["counts"]["queries"] <= 4
    assert (copy / "report.html").is_file() and (copy / "predictions.jsonl").is_file()


def test_lora_adapter_checkpoint_without_tracking(env, shards_dir):
    from vtg.checkpoints import HF_DIR, finalize, temp_dir_for
    from vtg.model.modeling import apply_finetune_mode, build_tiny_model, load_model_and_tokenizer

    root = env["tmp"] / "lora-checkpoints"
    model, tok = load_model_and_tokenizer(build_tiny_model())
    apply_finetune_mode(model, "lora", lora_r=4, lora_alpha=8).save_pretrained(temp_dir_for(root, 5) / HF_DIR)
    tok.save_pretrained(temp_dir_for(root, 5) / HF_DIR)
    meta = {"step": 5, "data_version": data_version(shards_dir), "git_commit": "test", "config_hash": "cfg",
            "finetune": "lora", "base": "tiny"}
    ckpt = finalize(root, 5, meta, {}, keep_last=1)
    assert (ckpt / HF_DIR / "adapter_config.json").is_file()
    cfg = env["cfg"].model_copy(deep=True)
    cfg.evaluate.out_dir, cfg.evaluate.store_dir = str(root / "out"), str(root / "store")
    cfg.evaluate.baselines = ["prior"]
    cfg.tracking.enabled = False
    runs = len(_eval_runs(env["client"]))
    res = evaluate_checkpoint(ckpt, "val", cfg)
    assert res.result["summary"]["counts"]["scored"] == 4 and set(res.result["summary"]["baselines"]) == {"prior"}
    assert res.result["mlflow_run_id"] is None and res.selection["best"] == str(ckpt)
    assert resolve_checkpoint(root / "out" / BEST_POINTER) == ckpt and len(_eval_runs(env["client"])) == runs


def test_eval_loss_selects_the_lowest_and_cards_that_differ_are_not_ranked(env):
    """`select_metric: eval_loss` is minimised; a result measured with other decoding settings (an ad-hoc
    evaluation with max_new_tokens 6) is refused by selection, and the message names the field."""
    cfg = env["cfg"]
    results = [evaluate_checkpoint(c, "val", cfg).result for c in env["ckpts"]]
    losses = [r["summary"]["model"]["eval_loss"] for r in results]
    assert losses[1] < losses[0], "30 steps of training should lower the eval loss"
    assert pick_best(results, "eval_loss") is results[1]
    assert pick_best(list(reversed(results)), "eval_loss") is results[1]
    other = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"max_new_tokens": 6})})
    odd = evaluate_checkpoint(env["ckpts"][0], "val", other, adhoc=True).result
    with pytest.raises(HarnessMismatch, match=r"decoding\.max_new_tokens: 12 vs 6"):
        pick_best([results[1], odd], "r1@0.5")
