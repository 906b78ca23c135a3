"""`python -m flows.lineage TARGET`: print the lineage chain of a model version, an eval run or a checkpoint.

TARGET is a checkpoint (a step dir, a pointer file such as `checkpoints/sft/latest`, `checkpoints/rl/latest` or
`reports/eval/best.json`), an MLflow run id (eval, train, rl or pipeline run), or a registered model version
(`models:/vtg-grounding/3`, `models:/vtg-grounding@best`).
The chain: source annotations + videos digest -> shard digest (DVC) -> preprocess params -> train run (params,
commit) -> SFT checkpoint [-> RL run (params) -> RL checkpoint] -> eval metrics. An RL checkpoint is followed to
the SFT checkpoint it started from (meta.json `parent_checkpoint`, else the RL run's tag) and on from there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.tracking import PARENT_TAG, client, experiment_id
from vtg import checkpoints
from vtg import lineage as L
from vtg.cli_common import run_cli
from vtg.config import load_config
from vtg.errors import VTGError
from vtg.sources import describe

RUN_ID = re.compile(r"^[0-9a-f]{32}$")
MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")
TRAIN_PARAMS = ("lr", "max_steps", "micro_batch_size", "zero_stage", "seed", "model.base", "model.finetune")
RL_PARAMS = ("init", "lr", "max_steps", "queries_per_step", "group_size", "temperature", "kl_beta", "seed")
RL_STAGE = "rl"  # the `vtg.stage` tag and meta.json `stage` of an RL run / checkpoint


@dataclass
class Chain:
    source_digest: str | None = None
    data_sources: str | None = None
    """Sources and licences of the training queries (`vtg.sources.describe`)."""
    data_mix: str | None = None
    """With `train.data.mix`: what SFT was trained on per mix source (`describe_mix`)."""
    shard_digest: str | None = None
    dvc_md5: str | None = None
    preprocess: dict[str, str] = field(default_factory=dict)
    pipeline_run: str | None = None
    flow_run: str | None = None
    train_run: str | None = None
    train_params: dict[str, str] = field(default_factory=dict)
    git_commit: str | None = None
    config_hash: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    model_version: str | None = None
    stage: str = "sft"
    """`sft`, or `rl`: then `checkpoint`/`step` are the RL checkpoint's and the train fields its parent's."""
    rl_run: str | None = None
    rl_params: dict[str, str] = field(default_factory=dict)
    parent_checkpoint: str | None = None
    """The SFT checkpoint an RL checkpoint started from."""
    parent_step: int | None = None
    parent_present: bool | None = None
    """RL only: whether the SFT checkpoint it started from is still on disk (None: not an RL checkpoint)."""

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _run(c, run_id: str | None):
    if not run_id:
        return None
    try:
        return c.get_run(run_id)
    except Exception:  # noqa: BLE001 - unknown id or deleted run: the chain just stops there
        return None


def start_from(c, target: str) -> tuple[Any, str | None, int | None, str | None]:
    """(run, checkpoint path, step, model version) from whatever the user gave."""
    path = Path(target)
    if path.exists():
        meta = checkpoints.read_checkpoint_meta(path)  # a step dir, a pointer file, or a checkpoint root
        ckpt = checkpoints.resolve_checkpoint(path)
        return _run(c, meta.get("mlflow_run_id")), str(ckpt), int(meta["step"]), None
    if m := MODEL_URI.match(target):
        mv = (c.get_model_version(m["name"], m["version"]) if m["version"]
              else c.get_model_version_by_alias(m["name"], m["alias"]))
        ckpt, step = mv.tags.get(L.TAG_CHECKPOINT), mv.tags.get(L.TAG_STEP)
        run = _run(c, mv.tags.get(L.TAG_TRAIN_RUN)) or _run(c, mv.run_id)
        return run, ckpt, int(step) if step else None, f"{mv.name} v{mv.version}"
    if RUN_ID.match(target):
        run = _run(c, target)
        if run is None:
            raise VTGError(f"no MLflow run {target} in this tracking store")
        t = run.data.tags
        return run, t.get(L.TAG_CHECKPOINT), int(t[L.TAG_STEP]) if t.get(L.TAG_STEP) else None, None
    raise VTGError(f"{target!r} is neither a checkpoint directory, an MLflow run id, nor models:/NAME/VERSION "
                   "or models:/NAME@ALIAS")


def build_chain(c, exp_id: str, target: str) -> Chain:
    run, ckpt, step, version = start_from(c, target)
    ch = Chain(checkpoint=ckpt, step=step, model_version=version)
    train = run
    if run is not None and run.data.tags.get(L.TAG_STAGE) == "evaluate":
        train = _run(c, run.data.tags.get(L.TAG_TRAIN_RUN))
    meta = _meta(ckpt)
    if meta.get("stage") == RL_STAGE or (train is not None and train.data.tags.get(L.TAG_STAGE) == RL_STAGE):
        return _rl_chain(c, exp_id, ch, train, meta)
    if train is not None and train.data.tags.get(L.TAG_STAGE) not in ("pipeline",):
        t = train.data.tags
        ch.train_run = train.info.run_id
        ch.train_params = {k: v for k, v in train.data.params.items() if k.split("train.", 1)[-1] in TRAIN_PARAMS}
        ch.git_commit, ch.config_hash = t.get(L.TAG_GIT_COMMIT), t.get(L.TAG_CONFIG_HASH)
        ch.shard_digest = t.get(L.TAG_DATA_VERSION)
        ch.data_sources = t.get(L.TAG_DATA_SOURCES)
    if meta.get("data_sources") is not None:  # the checkpoint's own word wins over a tag
        ch.data_sources = describe(meta["data_sources"])
    ch.data_mix = describe_mix(meta.get("data_mix"))
    pipeline = _run(c, (train or run).data.tags.get(PARENT_TAG)) if (train or run) is not None else None
    if run is not None and run.data.tags.get(L.TAG_STAGE) == "pipeline":
        pipeline = run
    _from_pipeline(c, ch, pipeline)
    if ch.train_run:
        ch.evals = _evals(c, exp_id, ch.train_run, step)
    return ch


def _meta(checkpoint: str | None) -> dict[str, Any]:
    """The checkpoint's meta.json when it is still there (an RL checkpoint's names its parent), else {}."""
    if not checkpoint or not Path(checkpoint).is_dir():
        return {}
    try:
        return checkpoints.read_checkpoint_meta(checkpoint)
    except VTGError:
        return {}


def _from_pipeline(c, ch: Chain, pipeline) -> None:
    """Fill what the pipeline run knows: the source and data versions, the preprocess run, its flow run."""
    if pipeline is None:
        return
    t = pipeline.data.tags
    ch.pipeline_run, ch.flow_run = pipeline.info.run_id, t.get(L.TAG_PREFECT_FLOW_RUN)
    ch.source_digest, ch.dvc_md5 = t.get(L.TAG_SOURCE_DIGEST), t.get("vtg.dvc_md5")
    ch.shard_digest = ch.shard_digest or t.get(L.TAG_DATA_VERSION)
    ch.git_commit = ch.git_commit or t.get(L.TAG_GIT_COMMIT)
    ch.config_hash = ch.config_hash or t.get(L.TAG_CONFIG_HASH)
    pre = _run(c, t.get("vtg.preprocess_run_id"))
    if pre is not None:
        ch.preprocess = dict(sorted(pre.data.params.items()))
    if not ch.train_params:
        ch.train_params = {k: v for k, v in pipeline.data.params.items()
                           if k.startswith("train.") and k[6:] in TRAIN_PARAMS}


def _evals(c, exp_id: str, run_id: str, step: int | None) -> list[dict[str, Any]]:
    """Eval runs of the checkpoints of one training (or RL) run, at `step` when given."""
    flt = f"tags.`{L.TAG_TRAIN_RUN}` = '{run_id}' and tags.`{L.TAG_STAGE}` = 'evaluate'"
    if step is not None:
        flt += f" and tags.`{L.TAG_STEP}` = '{step}'"
    return [{"run_id": r.info.run_id, "step": r.data.tags.get(L.TAG_STEP), "split": r.data.tags.get("vtg.split", "?"),
             "metrics": model_metrics(r.data.metrics, r.data.tags.get("vtg.split", ""))}
            for r in c.search_runs([exp_id], filter_string=flt, order_by=["attributes.start_time ASC"])]


def _rl_chain(c, exp_id: str, ch: Chain, rl_run, meta: dict[str, Any]) -> Chain:
    """An RL checkpoint: its RL run and evaluations, then the chain of the SFT checkpoint it started from (data
    version, train run, source), falling back to the RL run's own tags and pipeline run when that checkpoint is
    gone."""
    ch.stage = RL_STAGE
    tags = rl_run.data.tags if rl_run is not None else {}
    if rl_run is not None:
        ch.rl_run = rl_run.info.run_id
        ch.rl_params = {k: v for k, v in rl_run.data.params.items() if k.split("rl.", 1)[-1] in RL_PARAMS}
    parent_ref = checkpoints.parent_checkpoint(ch.checkpoint, meta) if meta.get("parent_checkpoint") else None
    ch.parent_checkpoint = str(parent_ref) if parent_ref else tags.get(L.TAG_PARENT_CHECKPOINT)
    ch.parent_step = meta.get("parent_step")
    run_id = meta.get("mlflow_run_id") or ch.rl_run
    if run_id:
        ch.evals = _evals(c, exp_id, run_id, ch.step)
    parent = ch.parent_checkpoint if ch.parent_checkpoint and Path(ch.parent_checkpoint).exists() else None
    ch.parent_present = parent is not None
    if parent:
        sft = build_chain(c, exp_id, parent)
        for k in ("source_digest", "data_sources", "data_mix", "shard_digest", "dvc_md5", "preprocess", "pipeline_run",
                  "flow_run", "train_run", "train_params", "git_commit", "config_hash"):
            setattr(ch, k, getattr(sft, k))
        ch.parent_step = ch.parent_step if ch.parent_step is not None else sft.step
    else:
        ch.git_commit, ch.config_hash = tags.get(L.TAG_GIT_COMMIT), tags.get(L.TAG_CONFIG_HASH)
        _from_pipeline(c, ch, _run(c, tags.get(PARENT_TAG)))
    # the RL checkpoint's own data version wins (it must be the parent's: RL trains on the same shards)
    ch.shard_digest = meta.get("data_version") or tags.get(L.TAG_DATA_VERSION) or ch.shard_digest
    own = describe(meta["data_sources"]) if meta.get("data_sources") is not None else tags.get(L.TAG_DATA_SOURCES)
    ch.data_sources = own or ch.data_sources
    return ch


def model_metrics(metrics: dict[str, float], split: str) -> dict[str, float]:
    """The model's own metrics of an eval run (`eval/<split>/r1_at_0.5` -> `r1_at_0.5`), not the baselines'."""
    out = {}
    for k, v in sorted(metrics.items()):
        name = k.removeprefix("eval/").removeprefix(f"{split}/")
        if "/" not in name and name != "n":
            out[name] = round(v, 4)
    return out


def describe_mix(mix: dict | None) -> str | None:
    """meta.json's `data_mix` in a line: "grounding 18 (75%), colours 6 (25%) examples" (None without a mix)."""
    if not mix or not mix.get("counts"):
        return None
    shares = mix.get("shares") or {}
    parts = [f"{name} {n} ({100 * shares.get(name, 0):.0f}%)" for name, n in mix["counts"].items()]
    return ", ".join(parts) + " examples (train.data.mix)"


def render(ch: Chain) -> str:
    pre = ", ".join(f"{k.removeprefix('preprocess.')}={v}" for k, v in list(ch.preprocess.items())[:12])
    lines = [
        f"source      annotations + videos digest {ch.source_digest or '?'}",
        f"  trained on {ch.data_sources or '? (sources not recorded)'}",
        *([f"  mixed      {ch.data_mix}"] if ch.data_mix else []),
        f"  -> shards data version {ch.shard_digest or '?'}  (DVC md5 {ch.dvc_md5 or '-'})",
        f"  -> preprocess params {pre or '?'}",
        f"  -> train run {ch.train_run or '?'}  commit {ch.git_commit or '?'}  config {ch.config_hash or '?'}",
        f"       params {', '.join(f'{k}={v}' for k, v in ch.train_params.items()) or '?'}",
    ]
    registered = f"  (registered as {ch.model_version})" if ch.model_version else ""
    if ch.stage == RL_STAGE:
        parent_step = ch.parent_step if ch.parent_step is not None else "?"
        lines += [
            f"  -> SFT checkpoint {ch.parent_checkpoint or '?'}  step {parent_step}"
            + ("" if ch.parent_present else "  (not on disk any more: the rest of the chain is from the RL run's tags)"),
            f"  -> RL run {ch.rl_run or '?'}  params {', '.join(f'{k}={v}' for k, v in ch.rl_params.items()) or '?'}",
            f"  -> RL checkpoint {ch.checkpoint or '?'}  step {ch.step if ch.step is not None else '?'}{registered}"]
    else:
        lines.append(f"  -> checkpoint {ch.checkpoint or '?'}  step {ch.step if ch.step is not None else '?'}"
                     f"{registered}")
    for e in ch.evals or [{}]:
        m = ", ".join(f"{k.removeprefix('eval/')}={v}" for k, v in e.get("metrics", {}).items()) or "?"
        lines.append(f"  -> eval run {e.get('run_id', '?')} ({e.get('split', '?')}, step {e.get('step', '?')}): {m}")
    lines.append(f"pipeline run {ch.pipeline_run or '?'}  Prefect flow run {ch.flow_run or '?'}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                     epilog="The tracking store comes from --params (tracking.tracking_uri) unless "
                                            "--tracking-uri is given.")
    parser.add_argument("target", help="checkpoint dir, MLflow run id, or models:/NAME/VERSION | models:/NAME@ALIAS")
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (overrides the params file)")
    parser.add_argument("--json", action="store_true", help="print the chain as JSON")
    args = parser.parse_args(argv)
    if not (Path(args.target).exists() or MODEL_URI.match(args.target) or RUN_ID.match(args.target)):
        raise VTGError(f"{args.target!r} is neither a checkpoint directory, an MLflow run id, nor "
                       "models:/NAME/VERSION or models:/NAME@ALIAS")
    overrides = [f"tracking.tracking_uri={args.tracking_uri}"] if args.tracking_uri else []
    cfg = load_config(args.params, None, overrides)
    c = client(cfg)
    chain = build_chain(c, experiment_id(cfg), args.target)
    print(json.dumps(chain.as_dict(), indent=1) if args.json else render(chain))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(_main))
