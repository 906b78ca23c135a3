"""GRPO after SFT: `run_rl(cfg)`, used by `python -m training.rl`, the benchmarks and the tests.

One step = one rollout and `rl.updates_per_rollout` optimizer steps:
1. take the next `queries_per_step` queries of the filtered train pool (a seeded permutation per epoch; each
   rank its share), sample `group_size` answers each with the policy's `generate`;
2. reward each answer with the temporal IoU of its span (`training.rl.algo.span_reward`), normalise rewards
   within each group (advantages);
3. teacher-force the sampled tokens through the engine (DeepSpeed ZeRO 0-3 or FSDP2, the SFT engine with a
   constant learning rate) and step on the clipped surrogate (+ beta x k3 KL to the frozen start policy,
   - entropy bonus).

Checkpoints follow the SFT contract (`vtg.checkpoints`) under `rl.out_dir`; meta.json names the parent SFT
checkpoint. Resume is exact: the run state (step, pool, metric history) is JSON and the RNG state (sampling
included) is saved per rank, as in SFT.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from training.callbacks import Callback, CallbackList
from training.dist import (
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    rng_state,
    seed_everything,
    set_determinism,
    set_rng_state,
)
from training.engine import build_engine
from training.loop import _broadcast, _protected, _read_rank_state, _write_rank_state
from training.rl import algo
from training.rl.rollout import Rollout, encode_prompts, sample, teacher_forced_logits, vision_token_ids
from vtg import checkpoints as ckpt
from vtg import lineage
from vtg.answer import parse_answer
from vtg.config import PipelineConfig, config_hash
from vtg.config._base import trajectory_view, view_hash
from vtg.errors import VTGError
from vtg.model.generation import greedy_answers
from vtg.model.processing import VisionParams
from vtg.queries import ReadStats, iter_examples
from vtg.selection import SELECTION_SPLIT, pick_best
from vtg.shards import data_version, list_shards
from vtg.spans import best_iou, summarize

log = logging.getLogger("training.rl")

STAGE = "rl"
STEP_METRICS = ("reward_mean", "reward_std", "iou_mean", "parse_failure_rate", "kl", "entropy", "clip_frac",
                "zero_advantage_groups", "rollout_s", "update_s")
"""Per-step metrics (`rl/<name>` in the tracker; columns of the steps CSV after `step`)."""


@dataclass
class RLState:
    step: int = 0
    pool: list[str] = field(default_factory=list)
    """Keys of the train queries RL samples from (after the difficulty filter), in pool order."""
    difficulty: dict = field(default_factory=dict)
    """The filter's counts: scored, kept, below / above the band, mean greedy IoU."""
    history: list[dict] = field(default_factory=list)
    """One row of STEP_METRICS per step (NaN where not measured)."""


def rl_hash(cfg: PipelineConfig, parent_digest: str) -> str:
    """What determines the RL trajectory: the rl settings (run length, logging and paths excluded) and the
    start checkpoint's content. Resuming needs a match."""
    return view_hash({"rl": trajectory_view(cfg.rl), "parent": parent_digest,
                      "precision": cfg.train.precision, "strategy": cfg.train.strategy})


def parent_digest(checkpoint: Path) -> str:
    """The start checkpoint's identity: its meta.json's file list (sizes and sha256 of every file)."""
    meta = ckpt.read_checkpoint_meta(checkpoint)
    return view_hash({"files": meta.get(ckpt.FILES_KEY) or [], "step": meta.get("step")})


def engine_config(cfg: PipelineConfig, micro_steps: int):
    """The SFT engine settings with RL's optimizer: constant lr (no warmup, no decay), RL's clip and ZeRO stage;
    gradients accumulate over the rollout's `micro_steps` micro-batches."""
    r = cfg.rl
    return cfg.train.model_copy(update={
        "lr": r.lr, "betas": r.betas, "weight_decay": 0.0, "grad_clip": r.grad_clip, "warmup_ratio": 0.0,
        "min_lr_ratio": 1.0, "max_steps": r.max_steps * r.updates_per_rollout, "grad_accum": micro_steps,
        "micro_batch_size": r.micro_batch_size, "zero_stage": r.zero_stage, "num_gpus": r.num_gpus})


# ---- the start checkpoint ------------------------------------------------------------------------------------
def start_checkpoint(cfg: PipelineConfig, device="cpu") -> Path:
    """`rl.init`: `best` = the SFT checkpoint that scores best on val by `evaluate.select_metric` (greedy answers
    scored with the shared span metrics, ranked by the shared rule `vtg.selection.pick_best`: what the evaluate
    stage would pick among the SFT checkpoints), `latest`, or a checkpoint directory."""
    init, root = cfg.rl.init, Path(cfg.train.out_dir)
    if init not in ("best", ckpt.LATEST):
        path = ckpt.resolve_checkpoint(init)
        ckpt.read_checkpoint_meta(path)  # complete, or a one-line error
        return path
    found = ckpt.list_checkpoints(root)
    if not found:
        raise VTGError(f"{root}: no complete SFT checkpoint to start RL from (run `python -m training` first, "
                       "or set rl.init to a checkpoint directory)")
    if init == ckpt.LATEST or len(found) == 1:
        return found[-1]
    select = cfg.evaluate.select_metric
    val = load_queries(cfg, SELECTION_SPLIT, limit=0)
    results = []
    for c in found:
        model, tokenizer = load_policy(ckpt.export_dir(c), device, torch.float32, trainable=False)
        ious = greedy_ious(model, tokenizer, val, cfg, device)
        metrics = summarize(ious, cfg.evaluate.iou_thresholds)
        log.info("RL start candidate %s: %s on %s %.4f, mIoU %.4f", c.name, select, SELECTION_SPLIT,
                 metrics.get(select, float("nan")), metrics["miou"])
        results.append({"checkpoint": str(c), "step": ckpt.read_checkpoint_meta(c)["step"], "stage": "sft",
                        "summary": {"model": metrics}})
        del model
    best = pick_best(results, select)
    log.info("RL starts from %s (best of %d SFT checkpoints on %s by %s: %.4f)", best["checkpoint"], len(found),
             SELECTION_SPLIT, select, best["summary"]["model"][select])
    return Path(best["checkpoint"])


def load_policy(export: Path, device, dtype: torch.dtype, trainable: bool):
    """The policy (or the frozen reference) from a checkpoint's HF export: full weights, or base + LoRA adapter
    (trainable adapters for the policy)."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from vtg.model.modeling import choose_attn_implementation

    hf_logging.disable_progress_bar()  # loading/saving bars would interleave with ours
    attn = choose_attn_implementation("auto", device, dtype)
    adapter = export / "adapter_config.json"
    try:
        if adapter.is_file():
            from peft import PeftModel

            base = json.loads(adapter.read_text())["base_model_name_or_path"]
            model = AutoModelForImageTextToText.from_pretrained(base, attn_implementation=attn, dtype=dtype)
            model = PeftModel.from_pretrained(model, str(export), is_trainable=trainable)
        else:
            model = AutoModelForImageTextToText.from_pretrained(export, attn_implementation=attn, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(export)
    except (OSError, ValueError, KeyError) as e:
        raise VTGError(f"{export}: cannot load the policy ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    model.to(device)
    if not trainable:
        model.eval().requires_grad_(False)
    else:
        model.train()
    return model, tokenizer


# ---- the query pool -------------------------------------------------------------------------------------------
def load_queries(cfg: PipelineConfig, split: str, limit: int) -> list:
    """Every readable query of `split` with its frames (`vtg.queries`: one example per query); train queries from
    training's shards, the others from evaluation's (as the evaluate stage reads them)."""
    stats = ReadStats()
    shards_dir = cfg.train.shards_dir if split == cfg.train.data.split else cfg.evaluate.shards_dir
    examples = list(iter_examples(list_shards(shards_dir, split), stats, limit=limit))
    if stats.skipped:
        log.warning("RL: skipped unreadable %s samples: %s", split, dict(stats.skipped))
    if not examples:
        raise VTGError(f"{shards_dir}/{split}: no readable queries for RL")
    return examples


def load_train_queries(cfg: PipelineConfig) -> list:
    return load_queries(cfg, cfg.train.data.split, cfg.rl.max_queries)


@torch.no_grad()
def greedy_ious(model, tokenizer, examples: list, cfg: PipelineConfig, device) -> list[float]:
    """IoU of the greedy answer to each query (evaluation's decoding: `vtg.model.generation.greedy_answers`)."""
    bs, ious = cfg.evaluate.batch_size, []
    for i in range(0, len(examples), bs):
        batch = examples[i:i + bs]
        answers = greedy_answers(model, tokenizer, batch, device, cfg.evaluate.max_new_tokens)
        ious += [best_iou(parse_answer(a), ex.windows)[0] for a, ex in zip(answers, batch, strict=True)]
    return ious


def difficulty_filter(model, tokenizer, examples: list, cfg: PipelineConfig, device) -> tuple[list[str], dict]:
    """Greedy answers of the start policy on every pool query; keep those whose IoU lies in
    [difficulty_min_iou, difficulty_max_iou]. Returns (kept keys, counts)."""
    r = cfg.rl
    ious = greedy_ious(model, tokenizer, examples, cfg, device)
    kept = [ex.key for ex, iou in zip(examples, ious, strict=True)
            if r.difficulty_min_iou <= iou <= r.difficulty_max_iou]
    counts = {"scored": len(examples), "kept": len(kept),
              "below": sum(iou < r.difficulty_min_iou for iou in ious),
              "above": sum(iou > r.difficulty_max_iou for iou in ious),
              "greedy_iou_mean": float(np.mean(ious)) if ious else float("nan"),
              "band": [r.difficulty_min_iou, r.difficulty_max_iou]}
    log.info("difficulty filter: kept %d of %d train queries with greedy IoU in [%.2f, %.2f] (%d below, %d above; "
             "mean greedy IoU %.3f)", counts["kept"], counts["scored"], r.difficulty_min_iou, r.difficulty_max_iou,
             counts["below"], counts["above"], counts["greedy_iou_mean"])
    if not kept:
        raise VTGError(f"difficulty filter kept none of {len(examples)} train queries (band [{r.difficulty_min_iou}, "
                       f"{r.difficulty_max_iou}]); widen rl.difficulty_min_iou / rl.difficulty_max_iou")
    return kept, counts


def step_queries(pool_size: int, step: int, per_step: int, seed: int) -> list[int]:
    """Pool indices of the queries of `step` (0-based): a fresh seeded permutation per pass over the pool, so
    the order depends only on (seed, step), never on what ran before (exact resume needs no data state)."""
    out = []
    for j in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(j, pool_size)
        perm = np.random.default_rng([seed, epoch]).permutation(pool_size)
        out.append(int(perm[pos]))
    return out


# ---- the trainer ----------------------------------------------------------------------------------------------
class GRPOTrainer:
    def __init__(self, cfg: PipelineConfig, callbacks: list[Callback] | None = None):
        self.cfg, self.rcfg = cfg, cfg.rl
        r = self.rcfg
        self.dist = init_distributed(cfg.train.strategy)
        if r.num_gpus != self.dist.world_size:
            log.warning("rl.num_gpus=%d but running on %d rank(s)", r.num_gpus, self.dist.world_size)
        if r.queries_per_step % self.dist.world_size:
            raise VTGError(f"rl.queries_per_step={r.queries_per_step} does not split over {self.dist.world_size} "
                           "ranks")
        seed_everything(r.seed + self.dist.rank)
        set_determinism(cfg.train.deterministic)
        self.device = self.dist.device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision, torch.float32)
        self.root = Path(r.out_dir)
        self.lock = ckpt.lock_checkpoint_root(self.root) if self.dist.is_main else None
        self.parent = Path(_broadcast(str(start_checkpoint(cfg, self.device)) if self.dist.is_main else None,
                                      self.dist))
        self.parent_meta = ckpt.read_checkpoint_meta(self.parent)
        self.hash = rl_hash(cfg, parent_digest(self.parent))
        self.data_version = _broadcast(data_version(cfg.train.shards_dir) if self.dist.is_main else None, self.dist)
        if self.parent_meta.get("data_version") != self.data_version:
            raise VTGError(f"{self.parent} was trained on data {str(self.parent_meta.get('data_version'))[:12]}, the "
                           f"shards are now {self.data_version[:12]}: retrain SFT first (`dvc repro train`)")
        resume = Path(_broadcast(str(self._resume_dir() or "") if self.dist.is_main else None, self.dist) or ".")
        self.resume_from = resume if resume != Path(".") else None
        self.model, self.tokenizer = load_policy(ckpt.export_dir(self.parent), self.device, self.dtype, True)
        self.vision = VisionParams.from_model_config(self.model.config)
        self.masked_ids = vision_token_ids(self.model.config)
        self.state = RLState()
        self.resumed_meta: dict = {}
        examples = load_train_queries(cfg)
        self.by_key = {ex.key: ex for ex in examples}
        if self.resume_from is not None:
            saved = _read_rank_state(self.resume_from, self.dist.rank)
            self.state = RLState(**saved["run"])
        else:
            kept, counts = (difficulty_filter(self.model, self.tokenizer, examples, cfg, self.device)
                            if self.dist.is_main else (None, None))
            self.state.pool, self.state.difficulty = _broadcast((kept, counts), self.dist)
        missing = [k for k in self.state.pool if k not in self.by_key]
        if missing:
            raise VTGError(f"{len(missing)} pool queries (e.g. {missing[0]}) are not in the train shards any more")
        self.ref = None
        if r.kl_beta > 0 or r.kl_every > 0:
            self.ref, _ = load_policy(ckpt.export_dir(self.parent), self.device, self.dtype, False)
        per_rank = r.queries_per_step // self.dist.world_size * r.group_size
        self.micro_steps = math.ceil(per_rank / r.micro_batch_size)
        self.engine = build_engine(self.model, engine_config(cfg, self.micro_steps), self.dist.world_size)
        self.callbacks = CallbackList(callbacks if callbacks is not None else default_callbacks(cfg, self.dist.is_main))
        if self.resume_from is not None:
            self.engine.load(ckpt.engine_dir(self.resume_from))
            set_rng_state(saved["rng"])
            self.resumed_meta = ckpt.read_checkpoint_meta(self.resume_from)
            log.info("resumed RL from %s (step %d)", self.resume_from, self.state.step)
        if self.lock is not None:
            self.lock.refresh()

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _resume_dir(self) -> Path | None:
        r = self.rcfg
        if r.resume not in ("auto", "never"):
            try:
                meta = ckpt.read_checkpoint_meta(r.resume, verify=True)
            except VTGError as e:
                raise VTGError(f"rl.resume={r.resume}: cannot resume from it: {e}") from None
            if meta.get("rl_hash") != self.hash:
                raise VTGError(f"rl.resume={r.resume}: saved with other rl settings or another start checkpoint "
                               f"(rl_hash {meta.get('rl_hash')} != {self.hash})")
            return ckpt.resolve_checkpoint(r.resume)
        if r.resume == "never":
            if ckpt.has_checkpoints(self.root):
                ckpt.move_aside(self.root, "rl.resume=never starts a fresh RL run")
            return None
        latest = ckpt.latest_checkpoint(self.root, verify=True)
        if latest is None:
            return None
        meta = ckpt.read_checkpoint_meta(latest)
        if meta.get("rl_hash") != self.hash:
            ckpt.move_aside(self.root, f"{latest.name} comes from other rl settings or another start checkpoint "
                                       f"(rl_hash {meta.get('rl_hash')} != {self.hash}; start {self.parent})")
            return None
        if meta.get("world_size") != self.dist.world_size:
            raise VTGError(f"{latest}: saved with world size {meta.get('world_size')}, now {self.dist.world_size}; "
                           "exact resume needs the same world size (or set rl.resume=never)")
        return latest

    # ---- one step ------------------------------------------------------------------------------------------
    def _rollout(self, step: int) -> tuple[Rollout, list, torch.Tensor, dict]:
        r, d = self.rcfg, self.dist
        ids = step_queries(len(self.state.pool), step, r.queries_per_step, r.seed)
        share = r.queries_per_step // d.world_size
        mine = [self.by_key[self.state.pool[i]] for i in ids[d.rank * share:(d.rank + 1) * share]]
        encoded = encode_prompts(self.tokenizer, mine, r.group_size, self.vision)
        roll = sample(self.engine.module, self.tokenizer, encoded, temperature=r.temperature, top_p=r.top_p,
                      max_new_tokens=r.max_new_tokens, device=self.device, dtype=self.dtype,
                      synced=self.dist.world_size > 1 and (r.zero_stage == 3 or self.cfg.train.strategy == "fsdp"))
        scored = [algo.span_reward(text, mine[i // r.group_size].windows, r.format_reward)
                  for i, text in enumerate(roll.texts)]
        rewards = torch.tensor([s[0] for s in scored], dtype=torch.float32)
        stats = {"reward_sum": float(rewards.sum()), "reward_sq": float((rewards ** 2).sum()),
                 "iou_sum": sum(s[1] for s in scored), "unparsed": sum(not s[2] for s in scored),
                 "n": len(scored), "tokens": float(roll.mask.sum())}
        return roll, mine, rewards, stats

    def _chunks(self, n: int) -> list[slice]:
        m = self.rcfg.micro_batch_size
        return [slice(i, min(i + m, n)) for i in range(0, n, m)]

    def _forward(self, inputs: dict):
        return self.engine.outputs(inputs)

    def _ref_forward(self, inputs: dict):
        return self.ref(**inputs)

    def _update(self, roll: Rollout, advantages: torch.Tensor, measure_kl: bool) -> dict:
        r = self.rcfg
        n = len(roll.encoded)
        chunks = self._chunks(n)
        adv = advantages.to(self.device)
        mask = roll.mask.to(self.device).float()
        tokens = roll.completions.to(self.device)
        need_ref = r.kl_beta > 0 or measure_kl
        ref_logp, old_logp = [None] * len(chunks), [None] * len(chunks)
        with torch.no_grad():
            for c, rows in enumerate(chunks):
                if need_ref:
                    ref_logits = teacher_forced_logits(self._ref_forward, self.tokenizer, roll, rows, self.device,
                                                       self.dtype, r.temperature, self.masked_ids)
                    ref_logp[c] = algo.token_logprobs(ref_logits, tokens[rows])
                if r.updates_per_rollout > 1:
                    old_logits = teacher_forced_logits(self._forward, self.tokenizer, roll, rows, self.device,
                                                       self.dtype, r.temperature, self.masked_ids)
                    old_logp[c] = algo.token_logprobs(old_logits, tokens[rows])
        acc = {"loss": 0.0, "kl_sum": 0.0, "ent_sum": 0.0, "clip_sum": 0.0, "tok": 0.0}
        for _ in range(r.updates_per_rollout):
            for c, rows in enumerate(chunks):
                logits = teacher_forced_logits(self._forward, self.tokenizer, roll, rows, self.device, self.dtype,
                                               r.temperature, self.masked_ids)
                logp = algo.token_logprobs(logits, tokens[rows])
                old = old_logp[c] if old_logp[c] is not None else logp.detach()
                m = mask[rows]
                loss, clip_frac = algo.policy_loss(logp, old, adv[rows], m, r.clip_eps)
                if r.entropy_coef > 0:
                    ent = algo.token_entropy(logits)
                    loss = loss - r.entropy_coef * algo.masked_mean(ent, m)
                else:
                    with torch.no_grad():
                        ent = algo.token_entropy(logits.detach())
                if ref_logp[c] is not None:
                    kl = algo.k3_kl(logp, ref_logp[c])
                    if r.kl_beta > 0:
                        loss = loss + r.kl_beta * algo.masked_mean(kl, m)
                    acc["kl_sum"] += float((kl.detach() * m).sum())
                self.engine.backward(loss)
                self.engine.step()
                t = float(m.sum())
                acc["loss"] += float(loss.detach()) / len(chunks)
                acc["ent_sum"] += float((ent.detach() * m).sum())
                acc["clip_sum"] += float(clip_frac) * t
                acc["tok"] += t
        return acc

    def train_step(self) -> dict:
        r, st = self.rcfg, self.state
        t0 = time.perf_counter()
        roll, _, rewards, stats = self._rollout(st.step)
        advantages, flat = algo.group_advantages(rewards, r.group_size, scale=r.scale_rewards)
        t1 = time.perf_counter()
        measure_kl = r.kl_beta > 0 or (r.kl_every > 0 and (st.step + 1) % r.kl_every == 0)
        upd = self._update(roll, advantages, measure_kl)
        t2 = time.perf_counter()
        sums = all_reduce_sum([stats["reward_sum"], stats["reward_sq"], stats["iou_sum"], stats["unparsed"],
                               stats["n"], upd["kl_sum"], upd["ent_sum"], upd["clip_sum"], upd["tok"], flat,
                               upd["loss"], stats["tokens"]], self.device)
        rs, rsq, iou, unparsed, n, kl, ent, clip, tok, flat_all, loss, gen_tokens = sums
        mean = rs / n
        row = {"reward_mean": mean, "reward_std": math.sqrt(max(rsq / n - mean ** 2, 0.0)), "iou_mean": iou / n,
               "parse_failure_rate": unparsed / n, "kl": kl / tok if measure_kl else float("nan"),
               "entropy": ent / tok, "clip_frac": clip / tok, "zero_advantage_groups": flat_all,
               "rollout_s": all_reduce_max(t1 - t0, self.device), "update_s": all_reduce_max(t2 - t1, self.device)}
        st.step += 1
        st.history.append({"step": st.step, **row})
        self._warn(row)
        return {**row, "loss": loss / self.dist.world_size, "gen_tokens": gen_tokens}

    def _warn(self, row: dict) -> None:
        r = self.rcfg
        if not self.dist.is_main:
            return
        if math.isfinite(row["kl"]) and row["kl"] > r.kl_warn:
            log.warning("step %d: rl/kl %.3f > rl.kl_warn %.3f: the policy drifts far from the start checkpoint "
                        "(watch for reward hacking: check the answers, raise rl.kl_beta or lower rl.lr)",
                        self.state.step, row["kl"], r.kl_warn)
        if row["entropy"] < r.entropy_warn:
            log.warning("step %d: rl/entropy %.3f < rl.entropy_warn %.3f: sampling is collapsing onto one answer "
                        "(mode collapse: lower rl.lr, or set rl.entropy_coef)", self.state.step, row["entropy"],
                        r.entropy_warn)

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        step, root = self.state.step, self.root
        tmp = ckpt.temp_dir_for(root, step)
        if self.dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            ckpt.engine_dir(tmp).mkdir(parents=True)
        barrier()
        self.engine.save(ckpt.engine_dir(tmp))
        _write_rank_state(tmp, self.dist.rank, {"run": asdict(self.state), "guard": {}, "rng": rng_state(),
                                                "num_workers": 0})
        state_dict = self.engine.full_state_dict()
        final = None
        if self.dist.is_main:
            self.engine.module.save_pretrained(ckpt.export_dir(tmp), state_dict=state_dict, safe_serialization=True)
            self.tokenizer.save_pretrained(ckpt.export_dir(tmp))
        barrier()
        if self.dist.is_main:
            last = self.state.history[-1] if self.state.history else {}
            pm = self.parent_meta
            meta = {"stage": STAGE, "parent_checkpoint": str(self.parent), "parent_step": pm.get("step"),
                    "data_version": self.data_version, "git_commit": lineage.git_commit(),
                    "config_hash": config_hash(self.cfg), "rl_hash": self.hash, "train_hash": pm.get("train_hash"),
                    "finetune": pm.get("finetune"), "base": pm.get("base"), "base_path": pm.get("base_path"),
                    "world_size": self.dist.world_size, "deterministic": self.cfg.train.deterministic,
                    "samples_seen": step * self.rcfg.queries_per_step * self.rcfg.group_size,
                    "metrics": {f"rl/{k}": last.get(k) for k in ("reward_mean", "iou_mean")},
                    "mlflow_run_id": None, **self.callbacks.checkpoint_meta()}
            final = ckpt.finalize(root, step, meta, self.cfg.model_dump(mode="json"), self.rcfg.keep_last,
                                  protect=_protected(self.cfg))
        barrier()
        if final is not None:
            self.callbacks.on_checkpoint(final, step)
        return final

    def run_info(self) -> dict:
        r = self.rcfg
        return {"parent": str(self.parent), "parent_step": self.parent_meta.get("step"), "start_step": self.state.step,
                "world_size": self.dist.world_size, "data_version": self.data_version,
                "git_commit": lineage.git_commit(), "pool": len(self.state.pool), "difficulty": self.state.difficulty,
                "batch": f"{r.queries_per_step} queries x {r.group_size} answers",
                "mlflow_run_id": self.resumed_meta.get("mlflow_run_id")}

    def fit(self, stop_after: int | None = None) -> dict:
        r, st = self.rcfg, self.state
        stop_at = min(r.max_steps, stop_after) if stop_after else r.max_steps
        self.callbacks.on_train_start(self.run_info())
        t_start, start_step = time.perf_counter(), st.step
        gen_tokens, rollout_s = 0.0, 0.0
        while st.step < stop_at:
            row = self.train_step()
            gen_tokens += row["gen_tokens"]
            rollout_s += row["rollout_s"]
            if st.step % r.log_every == 0 or st.step == stop_at:
                self.callbacks.on_step(st.step, {f"rl/{k}": row[k] for k in STEP_METRICS} | {"rl/loss": row["loss"]})
            if st.step % r.save_every == 0 or st.step == stop_at:
                self.save()
        wall = time.perf_counter() - t_start
        summary = run_summary(st, self.parent, self.parent_meta.get("step"), r.max_steps)
        summary.update({"wall_s": wall, "steps_run": st.step - start_step,
                        "rollout_tokens_per_s": gen_tokens / rollout_s if rollout_s > 0 else float("nan")})
        self.callbacks.on_train_end(summary)
        return summary


def run_summary(state: RLState, parent: Path, parent_step, max_steps: int) -> dict:
    """Run summary: the start, the filter's counts, and first/last-10-step means of the metrics."""
    h = state.history

    def mean(rows: list[dict], k: str) -> float:
        vals = [x[k] for x in rows if x.get(k) is not None and math.isfinite(x[k])]
        return float(np.mean(vals)) if vals else float("nan")

    first, last = h[:10], h[-10:]
    out = {"stage": STAGE, "enabled": True, "step": state.step, "completed": state.step >= max_steps,
           "parent_checkpoint": str(parent), "parent_step": parent_step, "difficulty": state.difficulty}
    for k in STEP_METRICS:
        out[f"first10/{k}"], out[f"last10/{k}"] = mean(first, k), mean(last, k)
    return out


def write_outputs(summary: dict, history: list[dict], report_dir: Path) -> None:
    """`steps.csv` (one row per step) and `summary.json` in the RL report folder (what DVC and the report read)."""
    from vtg.rl_outputs import STEPS_CSV, SUMMARY_JSON

    report_dir.mkdir(parents=True, exist_ok=True)
    with (report_dir / STEPS_CSV).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *STEP_METRICS])
        for row in history:
            w.writerow([row["step"], *(_fmt(row.get(k)) for k in STEP_METRICS)])
    (report_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=1, default=str) + "\n")


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return repr(float(v))


def default_callbacks(cfg: PipelineConfig, is_main: bool) -> list[Callback]:
    if not is_main:
        return []
    from training.callbacks.hooks import CheckpointHooks
    from training.rl.callbacks import RLConsole, RLMLflow

    cbs: list[Callback] = [RLConsole(cfg.rl.max_steps, cfg.rl.progress)]
    if cfg.tracking.enabled:
        cbs.append(RLMLflow(cfg))
    if cfg.rl.checkpoint_hooks:
        cbs.append(CheckpointHooks(cfg.rl.checkpoint_hooks))
    return cbs


def run_rl(cfg: PipelineConfig, callbacks: list[Callback] | None = None, stop_after: int | None = None) -> dict:
    """GRPO per `cfg.rl` from the SFT checkpoint `rl.init`; with `orchestration.rl` false, an empty root and a
    summary saying so. Writes the report files on rank 0 and returns the summary."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report_dir = Path(cfg.rl.report_dir)
    if not cfg.orchestration.rl:
        root = Path(cfg.rl.out_dir)
        moved = ckpt.move_aside(root, "orchestration.rl=false: this run has no RL checkpoints") \
            if ckpt.has_checkpoints(root) else None
        root.mkdir(parents=True, exist_ok=True)
        summary = {"stage": STAGE, "enabled": False, "reason": "orchestration.rl is false",
                   "moved_aside": str(moved) if moved else None}
        write_outputs(summary, [], report_dir)
        log.info("RL is off (orchestration.rl=false): %s is empty%s", root,
                 f" (the earlier RL checkpoints are in {moved})" if moved else "")
        return summary
    trainer = GRPOTrainer(cfg, callbacks)
    try:
        summary = trainer.fit(stop_after=stop_after)
        if trainer.dist.is_main:
            write_outputs(summary, trainer.state.history, report_dir)
        return {**summary, "history": list(trainer.state.history)}
    finally:
        trainer.release_lock()
