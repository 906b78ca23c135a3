"""Thin Prefect tasks: each resolves its inputs, makes one call into a stage entry point, and records the result.

Steps that produce data are cached by content (`flows.content.CONTENT_KEY`, results persisted), so a retried
flow run (`prefect flow-run retry`, the UI's Retry) skips every finished step whose inputs did not change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.tasks import exponential_backoff

from flows import tracking
from flows.content import CONTENT_KEY, StageContent, shard_digest
from flows.evaluation import results_path
from flows.events import append_jsonl
from flows.stages import ConfigArgs, module_cmd, run_stage, train_cmd
from vtg import lineage
from vtg.config import PipelineConfig, config_hash, load_config
from vtg.errors import VTGError

HOOK = "flows.events:on_checkpoint_saved"
_evaluators: dict[str, subprocess.Popen] = {}  # queue path -> embedded evaluator process (same flow process)


def _stream(name: str):
    logger = get_run_logger()
    return lambda line: logger.info("[%s] %s", name, line)


def _read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def _numbers(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[f"{prefix}{k}".replace("@", "_at_")] = float(v)
    return out


def _cached_stage(name: str):
    return task(name=name, cache_policy=CONTENT_KEY, persist_result=True, log_prints=True)


@_cached_stage("build-corpus")
def build_corpus(content: StageContent, cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    r = run_stage("corpus", module_cmd(cfg.orchestration.stages.corpus, args.argv()), on_line=_stream("corpus"))
    run_id = tracking.stage_run(cfg, parent, "corpus", params={"corpus": cfg.corpus.model_dump(mode="json")},
                                metrics={"seconds": r.seconds}, tags={lineage.TAG_CONFIG_HASH: content.config})
    return {"out_dir": cfg.corpus.out_dir, "seconds": r.seconds, "mlflow_run_id": run_id}


@_cached_stage("ingest-annotations")
def ingest(content: StageContent, cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    r = run_stage("ingest", module_cmd(cfg.orchestration.stages.ingest, args.argv()), on_line=_stream("ingest"))
    summary = _read_json(cfg.ingest.summary)
    run_id = tracking.stage_run(cfg, parent, "ingest", params={"ingest": cfg.ingest.model_dump(mode="json")},
                                metrics={**_numbers(summary), "seconds": r.seconds},
                                tags={lineage.TAG_SOURCE_DIGEST: content.inputs}, artifacts=[cfg.ingest.summary])
    return {"summary": summary, "seconds": r.seconds, "mlflow_run_id": run_id}


@_cached_stage("beam-preprocess")
def preprocess(content: StageContent, cfg: PipelineConfig, args: ConfigArgs, parent: str | None) -> dict:
    r = run_stage("preprocess", module_cmd(cfg.orchestration.stages.preprocess, args.argv()),
                  on_line=_stream("preprocess"))
    out = Path(cfg.preprocess.out_dir)
    manifest = _read_json(out / "manifest.json")
    digest = shard_digest(cfg)
    run_id = tracking.stage_run(
        cfg, parent, "preprocess", params={"preprocess": cfg.preprocess.model_dump(mode="json")},
        metrics={**_numbers(manifest), "seconds": r.seconds},
        tags={lineage.TAG_SOURCE_DIGEST: content.inputs, lineage.TAG_DATA_VERSION: digest,
              lineage.TAG_CONFIG_HASH: content.config}, artifacts=[out / "manifest.json"])
    tracking.log_shards_input(cfg, [run_id], digest, manifest)
    create_markdown_artifact(key="shard-manifest", markdown=manifest_markdown(cfg, manifest, digest),
                             description="Shards written by the Beam preprocessing job")
    return {"out_dir": str(out), "manifest": manifest, "shard_digest": digest, "seconds": r.seconds,
            "mlflow_run_id": run_id}


def manifest_markdown(cfg: PipelineConfig, manifest: dict, digest: str) -> str:
    rows = [f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |" for k, v in manifest.items()
            if not isinstance(v, list) or len(v) < 20]
    return "\n".join([f"# Shards `{cfg.preprocess.out_dir}`", f"shard digest: `{digest}`", "",
                      "| field | value |", "| --- | --- |", *rows])


def _sections_match_params(cfg: PipelineConfig, args: ConfigArgs, sections: tuple[str, ...]) -> bool:
    base = load_config(args.params)
    return all(config_hash(getattr(cfg, s)) == config_hash(getattr(base, s)) for s in sections)


@task(name="dvc-version-shards", retries=2, retry_delay_seconds=exponential_backoff(5), cache_policy=CONTENT_KEY,
      persist_result=True)  # retries: orchestration.task_retries (set by the flow)
def version_shards(content: StageContent, cfg: PipelineConfig, args: ConfigArgs) -> dict:
    """`dvc commit` the data stages (dvc.lock records the shard md5) and `dvc push` them to the remote."""
    logger = get_run_logger()
    data_stages = [s for s in ("corpus", "ingest", "preprocess") if s != "corpus" or cfg.orchestration.build_corpus]
    if not cfg.orchestration.dvc_version:
        return {"status": "disabled"}
    if not (Path(".dvc").is_dir() and Path("dvc.yaml").is_file()):
        return {"status": "skipped: not a DVC repository here"}
    if not _sections_match_params(cfg, args, ("corpus", "ingest", "preprocess")):
        logger.warning("data sections differ from %s (experiment/overrides): dvc.lock not updated; "
                       "use `dvc exp run -S ...` to version such data", args.params)
        return {"status": "skipped: data config differs from params.yaml"}
    dvc = str(Path(sys.executable).with_name("dvc"))
    run_stage("dvc-commit", [dvc, "commit", "--force", *data_stages], on_line=_stream("dvc"))
    pushed = run_stage("dvc-push", [dvc, "push", "--remote", cfg.orchestration.dvc_remote, "preprocess"],
                       on_line=_stream("dvc"))
    return {"status": "pushed", "remote": cfg.orchestration.dvc_remote, "dvc_md5": dvc_out_md5(cfg),
            "seconds": pushed.seconds}


def dvc_out_md5(cfg: PipelineConfig, stage: str = "preprocess") -> str | None:
    import yaml

    lock = Path("dvc.lock")
    if not lock.is_file():
        return None
    outs = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get(stage, {}).get("outs", [])
    target = Path(cfg.preprocess.out_dir).as_posix()
    return next((o.get("md5") for o in outs if Path(o.get("path", "")).as_posix() == target), None)


def eval_mode(cfg: PipelineConfig) -> str:
    """`embedded`, `events` or `off` for this run (`auto`: events when a served deployment can be triggered)."""
    o = cfg.orchestration
    if not o.eval_concurrently:
        return "off"
    if o.eval_trigger != "auto":
        return o.eval_trigger
    if not os.environ.get("PREFECT_API_URL"):
        return "embedded"
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment  # noqa: F401  (same client stack)

    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(o.eval_deployment)
        return "events"
    except Exception:  # noqa: BLE001 - no such deployment on this server: evaluate locally
        return "embedded"


def prefect_api_url() -> str | None:
    """The API this flow talks to: PREFECT_API_URL, or the ephemeral server this process started."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    from prefect.server.api.server import SubprocessASGIServer

    inst = SubprocessASGIServer._instances.get(None)
    return inst.api_url if inst is not None and inst.running else None


def start_evaluator(cfg: PipelineConfig, queue: Path, args: ConfigArgs, parent: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    url = prefect_api_url()
    if url:
        env["PREFECT_API_URL"] = url
    if parent:
        env[lineage.ENV_PARENT_RUN_ID] = parent
    log_path = queue.with_suffix(".log")
    return subprocess.Popen(
        [sys.executable, "-m", "flows.evaluation", "--queue", str(queue), "--split", cfg.evaluate.split,
         "--params", args.params], env=env, stdout=log_path.open("a"), stderr=subprocess.STDOUT)


_NON_SEMANTIC_TRAIN = {"resume", "checkpoint_hooks", "progress", "log_every"}


def _train_fingerprint(train_section: dict, data_version: str | None) -> str:
    kept = {k: v for k, v in train_section.items() if k not in _NON_SEMANTIC_TRAIN}
    return json.dumps([kept, data_version], sort_keys=True)


def stale_checkpoints(cfg: PipelineConfig) -> str | None:
    """Why the checkpoints under train.out_dir belong to another run (other train params or data), else None.

    Training resumes from `latest` (exact resume after a crash or a retry); checkpoints of a different
    configuration must not be resumed, so the flow clears them first, as `dvc repro` clears a stage's outputs."""
    latest = Path(cfg.train.out_dir) / "latest"
    if not (latest / "meta.json").is_file():
        return None
    old = _read_json(latest / "config.json").get("train", {})
    meta = _read_json(latest / "meta.json")
    from training.loop import data_version

    now = _train_fingerprint(cfg.train.model_dump(mode="json"), data_version(cfg.train.shards_dir))
    if _train_fingerprint(old, meta.get("data_version")) != now:
        return "different train params or data"
    return None


@_cached_stage("train-deepspeed")
def train(content: StageContent, cfg: PipelineConfig, args: ConfigArgs, parent: str | None, flow_run_id: str,
          queue: str) -> dict:
    """Launch training; every checkpoint it saves is evaluated concurrently (embedded process or events)."""
    logger = get_run_logger()
    mode = eval_mode(cfg)
    env = {lineage.ENV_PREFECT_FLOW_RUN_ID: flow_run_id, lineage.ENV_CHECKPOINT_QUEUE: queue}
    if parent:
        env[lineage.ENV_PARENT_RUN_ID] = parent
    if mode == "events":
        env[lineage.ENV_CHECKPOINT_EVENTS] = "1"
    elif mode == "embedded":
        _evaluators[queue] = start_evaluator(cfg, Path(queue), args, parent)
    logger.info("per-checkpoint evaluation: %s", mode)
    if reason := stale_checkpoints(cfg):
        logger.warning("clearing %s: its checkpoints come from %s (no resume across configs)",
                       cfg.train.out_dir, reason)
        shutil.rmtree(cfg.train.out_dir)
    hooks = list(getattr(cfg.train, "checkpoint_hooks", []) or [])
    extra = [f"train.checkpoint_hooks={json.dumps(hooks + [HOOK])}"] if HOOK not in hooks and hasattr(
        cfg.train, "checkpoint_hooks") else []
    cmd, launch_env = train_cmd(cfg, args.argv(extra))
    try:
        r = run_stage("train", cmd, env={**launch_env, **env}, on_line=_stream("train"))
    finally:
        append_jsonl(queue, {"done": True})
    out = Path(cfg.train.out_dir)
    latest = (out / "latest").resolve()
    meta = _read_json(latest / "meta.json")
    return {"out_dir": str(out), "latest": str(latest), "meta": meta, "eval_mode": mode, "seconds": r.seconds,
            "train_run_id": meta.get("mlflow_run_id") or meta.get("run_id")}


@task(name="wait-checkpoint-evals")
def wait_for_evaluations(cfg: PipelineConfig, queue: str) -> list[dict]:
    """Wait until every checkpoint reported in `queue` has an evaluation record (or the timeout passes)."""
    logger = get_run_logger()
    proc = _evaluators.pop(queue, None)
    deadline = time.time() + cfg.orchestration.eval_wait_s
    if proc is not None:
        try:
            rc = proc.wait(timeout=cfg.orchestration.eval_wait_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            raise VTGError(f"embedded evaluator did not finish within {cfg.orchestration.eval_wait_s}s "
                           f"(log: {Path(queue).with_suffix('.log')})") from None
        if rc != 0:
            tail = Path(queue).with_suffix(".log").read_text().splitlines()[-5:]
            raise VTGError(f"embedded evaluator failed (exit {rc}):\n  " + "\n  ".join(tail))
    expected = list(follow_all(Path(queue)))
    while True:
        done = evaluation_records(cfg, expected)
        if len(done) >= len(expected) or time.time() > deadline:
            break
        time.sleep(1.0)
    missing = len(expected) - len(done)
    if missing:
        logger.warning("%d of %d checkpoint evaluations did not finish in time", missing, len(expected))
    return done


def follow_all(queue: Path) -> list[dict]:
    if not queue.exists():
        return []
    return [json.loads(line) for line in queue.read_text().splitlines() if line.strip()
            and not json.loads(line).get("done")]


def evaluation_records(cfg: PipelineConfig, expected: list[dict]) -> list[dict]:
    """Evaluation records of the expected checkpoints (matched by directory and save time)."""
    path = results_path(cfg)
    if not path.is_file():
        return []
    want = {(e["checkpoint_dir"], round(float(e.get("saved_at", 0)), 3)) for e in expected}
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen: dict[tuple, dict] = {}
    for r in recs:
        k = (r.get("checkpoint_dir"), round(float(r.get("saved_at", 0)), 3))
        if k in want:
            seen[k] = r
    return sorted(seen.values(), key=lambda r: r["step"])


def pick_best(cfg: PipelineConfig, evals: list[dict], train_out: dict) -> tuple[str, int]:
    """The `best` pointer evaluation maintains (by evaluate.select_metric on val), else the best record, else latest."""
    pointer = Path(cfg.train.out_dir) / "best"
    meta = _read_json(pointer / "meta.json") if pointer.exists() else {}
    if meta.get("step") is not None and any(int(e["step"]) == int(meta["step"]) for e in evals):
        return str(pointer.resolve()), int(meta["step"])
    metric = cfg.evaluate.select_metric
    scored = [e for e in evals if metric in e.get("metrics", {}) and Path(e["checkpoint_dir"]).is_dir()]
    if scored:
        best = max(scored, key=lambda e: (e["metrics"][metric], e["step"]))
        return best["checkpoint_dir"], int(best["step"])
    return train_out["latest"], int(train_out.get("meta", {}).get("step", 0))


@task(name="write-report", retries=1, retry_delay_seconds=2)
def write_report(cfg: PipelineConfig, summary: dict[str, Any]) -> str:
    path = Path(cfg.orchestration.report_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    md = report_markdown(summary)
    path.write_text(md)
    create_markdown_artifact(key="run-summary", markdown=md, description="post-training run summary")
    evals = summary.get("evaluations", [])
    if evals:
        create_table_artifact(key="eval-metrics", table=[{"step": e["step"], **{k: round(v, 4) for k, v in
                              e.get("metrics", {}).items()}} for e in evals],
                              description="Metrics of every evaluated checkpoint")
    return str(path.resolve())


def report_markdown(s: dict[str, Any]) -> str:
    lines = ["# Post-training run report", "", "| | |", "| --- | --- |"]
    for k in ("flow_run_id", "mlflow_parent_run_id", "git_commit", "config_hash", "source_digest",
              "shard_digest", "dvc", "train_run_id", "best_checkpoint", "eval_mode", "seconds"):
        lines.append(f"| {k} | `{s.get(k)}` |")
    test = s.get("test_metrics") or {}
    if test:
        base = s.get("test_baselines") or {}
        lines += ["", f"## Held-out test metrics of the best checkpoint (`{s.get('best_checkpoint')}`)", "",
                  f"report: {s.get('test_report') or '-'}", "",
                  "| metric | model | " + " | ".join(f"blind: {b}" for b in base) + " |",
                  "| --- | --- |" + " --- |" * len(base)]
        for k, v in test.items():
            row = " | ".join(f"{base[b][k]:.4f}" if k in base[b] else "-" for b in base)
            lines.append(f"| {k} | {v:.4f} | {row} |")
    evals = s.get("evaluations", [])
    if evals:
        keys = sorted({k for e in evals for k in e.get("metrics", {})})
        lines += ["", "## Per-checkpoint evaluation (val)", "", "| step | " + " | ".join(keys) + " |",
                  "| --- |" + " --- |" * len(keys)]
        for e in evals:
            m = e.get("metrics", {})
            lines.append(f"| {e['step']} | " + " | ".join(f"{m[k]:.4f}" if k in m else "-" for k in keys) + " |")
    stages = s.get("stages", {})
    if stages:
        lines += ["", "## Steps", "", "| step | seconds | MLflow run |", "| --- | --- | --- |"]
        lines += [f"| {k} | {v.get('seconds', 0):.1f} | {v.get('mlflow_run_id') or '-'} |" for k, v in stages.items()]
    return "\n".join(lines) + "\n"
