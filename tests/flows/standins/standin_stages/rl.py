"""Stand-in for `python -m training.rl`: RL checkpoints under `rl.out_dir` from the newest SFT checkpoint, with the
same contract (meta.json names the parent checkpoint and its step, the same data version), the checkpoint hooks,
an MLflow run nested under the pipeline run, and `<rl.report_dir>/{steps.csv,summary.json}`; with
`orchestration.rl` false an empty root and a summary saying RL is off."""

import importlib
import os
import shutil
import time
from pathlib import Path

from standin_stages import parse, write_json
from vtg import checkpoints, lineage
from vtg.config import config_hash
from vtg.rl_outputs import STEPS_CSV, SUMMARY_JSON

COLUMNS = ("step", "reward_mean", "reward_std", "iou_mean", "parse_failure_rate", "kl", "entropy", "clip_frac",
           "zero_advantage_groups", "rollout_s", "update_s")

args, cfg = parse("rl")
out, report = Path(cfg.rl.out_dir), Path(cfg.rl.report_dir)
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True, exist_ok=True)
report.mkdir(parents=True, exist_ok=True)
rows = []
if not cfg.orchestration.rl:
    write_json(report / SUMMARY_JSON, {"stage": "rl", "enabled": False, "reason": "orchestration.rl is false"})
else:
    parent = checkpoints.latest_checkpoint(cfg.train.out_dir)
    pmeta = checkpoints.read_checkpoint_meta(parent)
    run_id = None
    if cfg.tracking.enabled:
        import mlflow

        mlflow.set_tracking_uri(cfg.tracking.tracking_uri)
        mlflow.set_experiment(cfg.tracking.experiment)
        up = os.environ.get(lineage.ENV_PARENT_RUN_ID)
        run = mlflow.start_run(run_name="rl-grpo", tags={
            lineage.TAG_STAGE: "rl", lineage.TAG_PARENT_CHECKPOINT: str(parent),
            lineage.TAG_DATA_VERSION: pmeta["data_version"], **({"mlflow.parentRunId": up} if up else {})})
        mlflow.log_params({"rl.lr": cfg.rl.lr, "rl.max_steps": cfg.rl.max_steps, "rl.group_size": cfg.rl.group_size})
        run_id = run.info.run_id
    hooks = list(cfg.rl.checkpoint_hooks)
    delay = float(os.environ.get("STANDIN_STEP_S", "0.02"))
    for step in range(1, cfg.rl.max_steps + 1):
        time.sleep(delay)
        rows.append((step, 0.3 + 0.1 * step, 0.2, 0.3 + 0.1 * step, 0.0, 0.0, 1.0, 0.0, 0, delay, 0.0))
        if step % cfg.rl.save_every == 0 or step == cfg.rl.max_steps:
            final, tmp = out / checkpoints.step_dir_name(step), checkpoints.temp_dir_for(out, step)
            checkpoints.export_dir(tmp).mkdir(parents=True, exist_ok=True)
            (checkpoints.export_dir(tmp) / "model.safetensors").write_bytes(f"rl from {parent} step={step}".encode())
            write_json(tmp / checkpoints.CONFIG_FILE, cfg.model_dump(mode="json"))
            write_json(tmp / checkpoints.META_FILE, {
                "stage": "rl", "parent_checkpoint": str(parent), "parent_step": pmeta["step"], "step": step,
                "data_version": pmeta["data_version"], "git_commit": lineage.git_commit(), "mlflow_run_id": run_id,
                "config_hash": config_hash(cfg), "finetune": pmeta["finetune"], "base": pmeta["base"]})
            tmp.rename(final)
            checkpoints.write_pointer(out / checkpoints.LATEST, final, step=step)
            for spec in hooks:
                mod, _, fn = spec.partition(":")
                getattr(importlib.import_module(mod), fn)(str(final), step)
            print(f"saved {final}", flush=True)
    if run_id:
        mlflow.end_run()
    write_json(report / SUMMARY_JSON, {"stage": "rl", "enabled": True, "step": cfg.rl.max_steps,
                                       "parent_checkpoint": str(parent), "parent_step": pmeta["step"]})
(report / STEPS_CSV).write_text("\n".join(",".join(map(str, r)) for r in [COLUMNS, *rows]) + "\n")
