"""MLflow side of an evaluation: one run per evaluation, linked to the training run and checkpoint step.

The eval run is tagged with the lineage keys (`vtg.lineage`), nested under `$VTG_MLFLOW_PARENT_RUN_ID` when
the orchestrator sets it, and holds metrics.json, predictions.jsonl and the report as artifacts. The same
metrics are logged to the training run at the checkpoint's step, so the training run shows eval curves.
MLflow metric names cannot contain `@`: `r1@0.7` on val is logged as `eval/val/r1_at_0.7`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from vtg.config import TrackingConfig
from vtg.harness import card_digest
from vtg.lineage import (
    ENV_PARENT_RUN_ID,
    TAG_CHECKPOINT,
    TAG_CONFIG_HASH,
    TAG_DATA_VERSION,
    TAG_GIT_COMMIT,
    TAG_STAGE,
    TAG_STEP,
    TAG_TRAIN_RUN,
    git_commit,
)
from vtg.net import check_tracking_server

log = logging.getLogger(__name__)

TAG_CHECKPOINT_DIGEST = "vtg.checkpoint_digest"
TAG_SPLIT = "vtg.split"
TAG_HARNESS = "vtg.harness"
"""The harness card's digest (`vtg.harness.card_digest`); `vtg.harness.<field>` tags carry its headline fields."""
TAG_CHECKPOINT_STAGE = "vtg.checkpoint_stage"
"""`sft` or `rl`: which training stage wrote the evaluated checkpoint (meta.json's `stage`)."""


def mlflow_key(name: str) -> str:
    return name.replace("@", "_at_")


def flat_metrics(result: dict) -> dict[str, float]:
    """The numbers worth a curve: model metrics, each baseline's, the visual gain; named `eval/<split>/...` so
    that val and test curves stay apart on the training run."""
    s = result["summary"]
    prefix = f"eval/{result['split']}/"
    out = {f"{prefix}{mlflow_key(k)}": float(v) for k, v in s["model"].items() if isinstance(v, int | float)}
    for name, b in s["baselines"].items():
        out.update({f"{prefix}{name}/{mlflow_key(k)}": float(v) for k, v in b.items()
                    if isinstance(v, int | float) and k != "n"})
    out.update({f"{prefix}visual_gain/{mlflow_key(k)}": float(v) for k, v in s["visual_gain"].items()})
    for task, t in ((s.get("forgetting") or {}).get("tasks") or {}).items():
        out[f"{prefix}general/{task}/accuracy"] = float(t["accuracy"])
        if t.get("retention") is not None:
            out[f"{prefix}general/{task}/retention"] = float(t["retention"])
    for overall in ("min_retention", "mean_retention"):
        if (s.get("forgetting") or {}).get(overall) is not None:
            out[f"{prefix}general/{overall}"] = float(s["forgetting"][overall])
    ci = s.get("intervals") or {}
    for k, (lo, hi) in (ci.get("model") or {}).items():
        out.update({f"{prefix}{mlflow_key(k)}_ci_low": lo, f"{prefix}{mlflow_key(k)}_ci_high": hi})
    for k, entry in (ci.get("visual_gain") or {}).items():
        if entry.get("ci"):
            out.update({f"{prefix}visual_gain/{mlflow_key(k)}_ci_low": entry["ci"][0],
                        f"{prefix}visual_gain/{mlflow_key(k)}_ci_high": entry["ci"][1]})
    return out


def forgetting_tags(result: dict) -> dict[str, str]:
    """`vtg.forgetting`: the retention warnings of the evaluation, when there are any."""
    warnings = ((result.get("summary") or {}).get("forgetting") or {}).get("warnings")
    return {"vtg.forgetting": "; ".join(warnings)[:500]} if warnings else {}


def harness_tags(result: dict) -> dict[str, str]:
    """The harness card's digest and headline fields as run tags (the whole card is in metrics.json, an
    artifact of the run)."""
    card = (result.get("summary") or {}).get("harness")
    if not card:
        return {}
    frames = card["frames"].get("per_query") or {}
    return {TAG_HARNESS: card_digest(card), f"{TAG_HARNESS}.protocol": card["protocol"],
            f"{TAG_HARNESS}.family": card["model"]["family"],
            f"{TAG_HARNESS}.frames": f"{frames.get('min')}-{frames.get('max')}",
            f"{TAG_HARNESS}.prompt_digest": card["prompt"]["digest"],
            f"{TAG_HARNESS}.parser_version": card["parser"]["version"]}


def client(tracking: TrackingConfig):
    import mlflow

    check_tracking_server(tracking.tracking_uri)
    mlflow.set_tracking_uri(tracking.tracking_uri)
    # the registry is this tracking store's, whatever URI a library or an earlier call set globally
    return mlflow.MlflowClient(tracking.tracking_uri, registry_uri=tracking.tracking_uri)


def _experiment_id(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp else c.create_experiment(name)


def start_eval_run(tracking: TrackingConfig, result: dict) -> str:
    """Create the eval run with its lineage tags (nested under the orchestrator's run when set)."""
    c = client(tracking)
    tags = {TAG_STAGE: "evaluate", TAG_CHECKPOINT: result["checkpoint"], TAG_STEP: str(result["step"]),
            TAG_DATA_VERSION: str(result.get("data_version") or ""), TAG_TRAIN_RUN: result.get("train_run_id") or "",
            TAG_GIT_COMMIT: git_commit(), TAG_CONFIG_HASH: result["settings_hash"],
            TAG_CHECKPOINT_DIGEST: result["checkpoint_digest"], TAG_SPLIT: result["split"],
            TAG_CHECKPOINT_STAGE: result["stage"], **harness_tags(result), **forgetting_tags(result),
            "mlflow.note.content": f"Evaluation of {result['checkpoint']} on {result['split']}"}
    if parent := os.environ.get(ENV_PARENT_RUN_ID):
        tags["mlflow.parentRunId"] = parent
    run = c.create_run(_experiment_id(c, tracking.experiment),
                       run_name=f"eval-{result['checkpoint_name']}-{result['split']}", tags=tags)
    return run.info.run_id


def finish_eval_run(tracking: TrackingConfig, run_id: str, result: dict, entry: Path, params: dict) -> None:
    """Metrics at the checkpoint's step, params, and the entry's files as artifacts; then FINISHED."""
    from mlflow.entities import Metric, Param

    c = client(tracking)
    now = int(time.time() * 1000)
    c.log_batch(run_id, metrics=[Metric(k, v, now, result["step"]) for k, v in flat_metrics(result).items()],
                params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    for p in sorted(entry.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            c.log_artifact(run_id, str(p), "report" if p.suffix in (".html", ".png") else None)
    c.set_terminated(run_id, "FINISHED")


def tag_run(tracking: TrackingConfig, run_id: str, tags: dict[str, str]) -> bool:
    """Set tags on a run (the training run's overfitting warning); False when that run is not in this store."""
    from mlflow.exceptions import MlflowException

    c = client(tracking)
    try:
        for k, v in tags.items():
            c.set_tag(run_id, k, v)
    except MlflowException as e:
        log.warning("could not tag run %s: %s", run_id, str(e).splitlines()[0])
        return False
    return True


def fail_eval_run(tracking: TrackingConfig, run_id: str) -> None:
    client(tracking).set_terminated(run_id, "FAILED")


def log_to_train_run(tracking: TrackingConfig, result: dict) -> bool:
    """Eval metrics onto the training run at the checkpoint's step; False when that run is not in this store."""
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException

    run_id = result.get("train_run_id")
    if not run_id:
        return False
    c = client(tracking)
    now = int(time.time() * 1000)
    try:
        c.log_batch(run_id, metrics=[Metric(k, v, now, result["step"]) for k, v in flat_metrics(result).items()])
    except MlflowException as e:
        log.warning("could not log eval metrics to training run %s: %s", run_id, str(e).splitlines()[0])
        return False
    return True
