import importlib
import os
import shutil
import time
from pathlib import Path

from standin_stages import parse, write_json
from vtg import checkpoints
from vtg.config import config_hash
from vtg.lineage import ENV_PARENT_RUN_ID, git_commit
from vtg.shards import data_version

args, cfg = parse("train")
out = Path(cfg.train.out_dir)
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True, exist_ok=True)
run_id = None
if cfg.tracking.enabled:
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
    mlflow.set_experiment(cfg.tracking.experiment)
    parent = os.environ.get(ENV_PARENT_RUN_ID)
    run = mlflow.start_run(run_name="train", tags={"vtg.stage": "train", **({"mlflow.parentRunId": parent} if parent else {})})
    mlflow.log_params({"lr": cfg.train.lr, "max_steps": cfg.train.max_steps})
    run_id = run.info.run_id
hooks = list(getattr(cfg.train, "checkpoint_hooks", None) or ["flows.events:on_checkpoint_saved"])
delay = float(os.environ.get("STANDIN_STEP_S", "0.02"))
for step in range(1, cfg.train.max_steps + 1):
    time.sleep(delay)
    if step % cfg.train.save_every == 0 or step == cfg.train.max_steps:
        final = out / f"step-{step:06d}"
        tmp = out / f".tmp-step-{step:06d}"
        checkpoints.export_dir(tmp).mkdir(parents=True, exist_ok=True)
        (checkpoints.export_dir(tmp) / "model.safetensors").write_bytes(f"weights lr={cfg.train.lr} step={step}".encode())
        write_json(tmp / checkpoints.CONFIG_FILE, cfg.model_dump(mode="json"))
        write_json(tmp / checkpoints.META_FILE, {"step": step, "data_version": data_version(cfg.train.shards_dir),
                                                 "git_commit": git_commit(), "mlflow_run_id": run_id,
                                                 "config_hash": config_hash(cfg), "finetune": "full", "base": "tiny"})
        tmp.rename(final)
        checkpoints.write_pointer(out / checkpoints.LATEST, final, step=step)
        for spec in hooks:
            mod, _, fn = spec.partition(":")
            getattr(importlib.import_module(mod), fn)(str(final), step)
        print(f"saved {final}", flush=True)
if run_id:
    mlflow.end_run()
