"""GRPO after SFT: `run_rl(cfg)`, used by `python -m training.rl`, the benchmarks and the tests.

One step = one rollout and `rl.updates_per_rollout` optimizer steps:
1. take the next `queries_per_step` queries of the filtered train pool (a seeded permutation per epoch; each
   rank its share), sample `group_size` answers each with the policy's `generate`;
2. reward each answer with the temporal IoU of its span (`training.rl.algo.span_reward`), normalise rewards
   within each group (advantages);
3. teacher-force the sampled tokens through the engine (DeepSpeed ZeRO 0-3, built from `rl`'s engine
   settings) and step on the clipped surrogate (+ beta x k3 KL to the frozen start policy, - entropy bonus).
Every pass (sampling, the reference, the update's micro-batches) encodes each query's video once for its G rows
(`training.rl.rollout`); `steps.csv` times each phase (`training.rl.outputs.PHASES`).

`GRPOModule` is a train module: around its steps runs the one trainer SFT runs under (`training.trainer.Trainer`:
the lock, exact resume (the run state: step, pool, metric history; the RNG, sampling included), checkpoints under
`rl.out_dir` with the SFT contract (meta.json names the parent checkpoint), retention). The start checkpoint and
the query pool: `training.rl.start`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from training.callbacks import Callback
from training.dist import (
    all_reduce_max,
    all_reduce_sum,
    broadcast,
    seed_everything,
    set_determinism,
)
from training.engine import EngineSettings, build_engine
from training.lifecycle import move_aside
from training.rl import algo
from training.rl.outputs import STAGE, STEP_METRICS, run_summary, write_outputs
from training.rl.phases import PhaseClock
from training.rl.rollout import (
    Rollout,
    encode_prompts,
    padding_slots,
    sample,
    teacher_forced_logits,
    vision_token_ids,
)
from training.rl.start import (
    difficulty_filter,
    load_train_queries,
    parent_digest,
    start_checkpoint,
    step_queries,
)
from training.trainer import Trainer, TrainModule, run_module
from vtg import checkpoints as ckpt
from vtg.config import PipelineConfig
from vtg.config.keys import trajectory_view, view_hash
from vtg.errors import VTGError
from vtg.model.modeling import load_model_and_tokenizer, torch_dtype
from vtg.model.processing import VisionParams
from vtg.shards import data_sources, data_version

log = logging.getLogger("training.rl")

RL_KEY = "rl_hash"
"""meta.json key of the RL run key (`rl_hash`): resuming needs a match."""


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
    """What determines the RL trajectory: the rl settings and the shared `engine` (run length, logging and paths
    excluded) and the start checkpoint's content. Resuming needs a match."""
    return view_hash({"rl": trajectory_view(cfg.rl), "engine": trajectory_view(cfg.engine), "parent": parent_digest})


class GRPOModule(TrainModule):
    """GRPO as a train module: one step = one rollout and `rl.updates_per_rollout` optimizer steps."""

    section, key_name = "rl", RL_KEY

    def __init__(self, cfg: PipelineConfig):
        self.cfg, self.rcfg = cfg, cfg.rl

    def setup(self, trainer: Trainer) -> None:
        cfg, r, d = self.cfg, self.rcfg, trainer.dist
        self.dist = d
        if r.num_gpus != d.world_size:
            log.warning("rl.num_gpus=%d but running on %d rank(s)", r.num_gpus, d.world_size)
        if cfg.engine.strategy == "fsdp":  # measured: transformers' generate runs the vision tower before FSDP2 has
            # gathered the root module's parameters (aten.convolution: mixed torch.Tensor and DTensor)
            raise VTGError("rl: FSDP2 cannot run the RL stage yet (generate's vision pass meets sharded parameters); "
                           "run it with engine.strategy=deepspeed (ZeRO 0-3)")
        if r.queries_per_step % d.world_size:
            raise VTGError(f"rl.queries_per_step={r.queries_per_step} does not split over {d.world_size} ranks")
        set_determinism(cfg.engine.deterministic)
        self.device, self.dtype = d.device, torch_dtype(cfg.engine.precision)
        self.parent = Path(broadcast(str(start_checkpoint(cfg)) if d.is_main else None, d))
        # seeded after the start choice: whether it evaluated or reused stored results must not move the trajectory
        seed_everything(r.seed + d.rank)
        self.parent_meta = ckpt.read_checkpoint_meta(self.parent)
        self.hash = rl_hash(cfg, parent_digest(self.parent))
        self.data_version = broadcast(data_version(cfg.train.shards_dir) if d.is_main else None, d)
        self.data_sources = broadcast(data_sources(cfg.train.shards_dir) if d.is_main else None, d)
        if self.parent_meta.get("data_version") != self.data_version:
            raise VTGError(f"{self.parent} was trained on data {str(self.parent_meta.get('data_version'))[:12]}, the "
                           f"shards are now {self.data_version[:12]}: retrain SFT first (`dvc repro train`)")
        resuming = trainer.decide_resume() is not None
        self.model, self.tokenizer = load_model_and_tokenizer(ckpt.export_dir(self.parent), device=self.device,
                                                              dtype=self.dtype, trainable=True)
        self.vision = VisionParams.from_model(self.model)  # the start checkpoint's processor facts
        self.masked_ids = vision_token_ids(self.model.config)
        self.state = RLState()
        examples = load_train_queries(cfg)
        self.by_key = {ex.key: ex for ex in examples}
        if not resuming:
            kept, counts = (difficulty_filter(self.model, self.tokenizer, examples, cfg, self.device)
                            if d.is_main else (None, None))
            self.state.pool, self.state.difficulty = broadcast((kept, counts), d)
        self.ref = None
        if r.kl_beta > 0 or r.kl_every > 0:
            self.ref, _ = load_model_and_tokenizer(ckpt.export_dir(self.parent), device=self.device, dtype=self.dtype)
        per_rank = r.queries_per_step // d.world_size * r.group_size
        self.micro_steps = math.ceil(per_rank / r.micro_batch_size)
        self.engine = build_engine(self.model, EngineSettings.for_rl(cfg, self.micro_steps), d.world_size)
        self.gen_tokens, self.rollout_s = 0.0, 0.0

    def run_key(self) -> str:
        return self.hash

    def state_dict(self) -> dict:
        return {"run": asdict(self.state), "guard": {}}

    def load_state_dict(self, saved: dict, src: Path) -> None:
        self.state = RLState(**saved["run"])
        log.info("resumed RL from %s (step %d)", src, self.state.step)
        missing = [k for k in self.state.pool if k not in self.by_key]
        if missing:
            raise VTGError(f"{len(missing)} pool queries (e.g. {missing[0]}) are not in the train shards any more")

    # ---- one step ------------------------------------------------------------------------------------------
    def _rollout(self, step: int, clock: PhaseClock) -> tuple[Rollout, list, torch.Tensor, dict]:
        r, d = self.rcfg, self.dist
        ids = step_queries(len(self.state.pool), step, r.queries_per_step, r.seed)
        share = r.queries_per_step // d.world_size
        mine = [self.by_key[self.state.pool[i]] for i in ids[d.rank * share:(d.rank + 1) * share]]
        encoded = encode_prompts(self.tokenizer, mine, r.group_size, self.vision)
        synced = self.dist.world_size > 1 and (r.zero_stage == 3 or self.cfg.engine.strategy == "fsdp")
        with clock.phase("generate_s"):
            roll = sample(self.engine.module, self.tokenizer, encoded, temperature=r.temperature, top_p=r.top_p,
                          max_new_tokens=r.max_new_tokens, device=self.device, dtype=self.dtype, synced=synced)
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

    def _update(self, roll: Rollout, advantages: torch.Tensor, measure_kl: bool, clock: PhaseClock) -> dict:
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
                    with clock.phase("ref_s"):
                        ref_logits = teacher_forced_logits(self._ref_forward, self.tokenizer, roll, rows, self.device,
                                                           self.dtype, r.temperature, self.masked_ids, self.ref)
                        ref_logp[c] = algo.token_logprobs(ref_logits, tokens[rows])
                if r.updates_per_rollout > 1:
                    with clock.phase("old_s"):
                        old_logits = teacher_forced_logits(self._forward, self.tokenizer, roll, rows, self.device,
                                                           self.dtype, r.temperature, self.masked_ids,
                                                           self.engine.module)
                        old_logp[c] = algo.token_logprobs(old_logits, tokens[rows])
        acc = {"loss": 0.0, "kl_sum": 0.0, "ent_sum": 0.0, "clip_sum": 0.0, "tok": 0.0}
        for _ in range(r.updates_per_rollout):
            for c, rows in enumerate(chunks):
                with clock.phase("forward_s"):
                    loss, share, stats = self._loss(roll, rows, tokens, mask, adv, old_logp[c], ref_logp[c])
                with clock.phase("backward_s"):
                    self.engine.backward(loss * share if share != 1 else loss)
                with clock.phase("optimizer_s"):
                    self.engine.step()
                for k, v in stats.items():
                    acc[k] += v
                acc["loss"] += float(loss.detach()) / len(chunks)
        return acc

    def _loss(self, roll: Rollout, rows: slice, tokens: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
              old: torch.Tensor | None, ref: torch.Tensor | None) -> tuple[torch.Tensor, float, dict]:
        """One micro-batch's teacher-forced forward: (loss, its weight in the rollout, the metrics' sums)."""
        r, n = self.rcfg, len(roll.encoded)
        logits = teacher_forced_logits(self._forward, self.tokenizer, roll, rows, self.device, self.dtype,
                                       r.temperature, self.masked_ids, self.engine.module)
        logp = algo.token_logprobs(logits, tokens[rows])
        old = old if old is not None else logp.detach()
        m = mask[rows]
        loss, clip_frac = algo.policy_loss(logp, old, adv[rows], m, r.clip_eps)
        # the engine averages its micro-batches equally: weigh each by its share of the rollout's sequences,
        # so a short last chunk counts as much per sequence as the others (x1.0 when they divide evenly)
        share = (rows.stop - rows.start) * len(self._chunks(n)) / n
        if r.entropy_coef > 0:
            ent = algo.token_entropy(logits)
            loss = loss - r.entropy_coef * algo.masked_mean(ent, m)
        else:
            with torch.no_grad():
                ent = algo.token_entropy(logits.detach())
        kl_sum = 0.0
        if ref is not None:
            kl = algo.k3_kl(logp, ref)
            if r.kl_beta > 0:
                loss = loss + r.kl_beta * algo.masked_mean(kl, m)
            kl_sum = float((kl.detach() * m).sum())
        t = float(m.sum())
        stats = {"kl_sum": kl_sum, "ent_sum": float((ent.detach() * m).sum()), "clip_sum": float(clip_frac) * t,
                 "tok": t}
        return loss, share, stats

    def train_step(self) -> dict:
        r, st = self.rcfg, self.state
        clock = PhaseClock(self.device)
        t0 = time.perf_counter()
        roll, _, rewards, stats = self._rollout(st.step, clock)
        advantages, flat = algo.group_advantages(rewards, r.group_size, scale=r.scale_rewards)
        t1 = time.perf_counter()
        measure_kl = r.kl_beta > 0 or (r.kl_every > 0 and (st.step + 1) % r.kl_every == 0)
        upd = self._update(roll, advantages, measure_kl, clock)
        t2 = time.perf_counter()
        pad = padding_slots(roll, self._chunks(len(roll.encoded)))
        sums = all_reduce_sum([stats["reward_sum"], stats["reward_sq"], stats["iou_sum"], stats["unparsed"],
                               stats["n"], upd["kl_sum"], upd["ent_sum"], upd["clip_sum"], upd["tok"], flat,
                               upd["loss"], stats["tokens"], pad["prefill_slots"], pad["prefill_real"],
                               pad["update_slots"], pad["update_real"]], self.device)
        rs, rsq, iou, unparsed, n, kl, ent, clip, tok, flat_all, loss, gen_tokens, pslots, preal, uslots, ureal = sums
        mean = rs / n
        row = {"reward_mean": mean, "reward_std": math.sqrt(max(rsq / n - mean ** 2, 0.0)), "iou_mean": iou / n,
               "parse_failure_rate": unparsed / n, "kl": kl / tok if measure_kl else float("nan"),
               "entropy": ent / tok, "clip_frac": clip / tok, "zero_advantage_groups": flat_all,
               "rollout_s": all_reduce_max(t1 - t0, self.device), "update_s": all_reduce_max(t2 - t1, self.device),
               **{k: all_reduce_max(v, self.device) for k, v in clock.row().items()},
               "prefill_padding_frac": 1 - preal / pslots, "update_padding_frac": 1 - ureal / uslots}
        st.step += 1
        st.history.append({"step": st.step, **row})
        self._warn(row)
        self.gen_tokens += gen_tokens
        self.rollout_s += row["rollout_s"]
        self.row = {**row, "loss": loss / self.dist.world_size, "gen_tokens": gen_tokens}
        return self.row

    def step_metrics(self) -> dict[str, float]:
        return {f"rl/{k}": self.row[k] for k in STEP_METRICS} | {"rl/loss": self.row["loss"]}

    def _warn(self, row: dict) -> None:
        r = self.rcfg
        if not self.dist.is_main:
            return
        if math.isfinite(row["kl"]) and row["kl"] > r.kl_warn:
            log.warning("step %d: rl/kl %.3f > rl.kl_warn %.3f: the policy drifts far from the start checkpoint "
                        "(watch for reward hacking: check the answers, raise rl.kl_beta or lower rl.lr)",
                        self.state.step, row["kl"], r.kl_warn)
        if row["parse_failure_rate"] >= 1.0:
            log.warning("step %d: every answer failed to parse (rl/parse_failure_rate 1.0): the reward is 0 everywhere "
                        "and nothing is learned; the start checkpoint %s does not answer in the span format (check "
                        "the SFT stage's evaluation, or rl.init)", self.state.step, self.parent)
        elif row["zero_advantage_groups"] >= r.queries_per_step:
            log.warning("step %d: all %d groups are flat (every answer of a query got the same reward): no policy "
                        "gradient at this step (raise rl.group_size or rl.temperature, or filter easier queries)",
                        self.state.step, r.queries_per_step)
        if row["entropy"] < r.entropy_warn:
            log.warning("step %d: rl/entropy %.3f < rl.entropy_warn %.3f: sampling is collapsing onto one answer "
                        "(mode collapse: lower rl.lr, or set rl.entropy_coef)", self.state.step, row["entropy"],
                        r.entropy_warn)

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def checkpoint_meta(self) -> dict:
        step, pm = self.state.step, self.parent_meta
        last = self.state.history[-1] if self.state.history else {}
        parent = ckpt.parent_ref(Path(self.rcfg.out_dir) / ckpt.step_dir_name(step), self.parent)
        return {"stage": STAGE, "parent_checkpoint": parent, "parent_step": pm.get("step"),
                "train_hash": pm.get("train_hash"),
                "finetune": pm.get("finetune"), "base": pm.get("base"), "base_path": pm.get("base_path"),
                "samples_seen": step * self.rcfg.queries_per_step * self.rcfg.group_size,
                "metrics": {f"rl/{k}": last.get(k) for k in ("reward_mean", "iou_mean")}}

    def run_info(self) -> dict:
        r = self.rcfg
        return {"parent": str(self.parent), "parent_step": self.parent_meta.get("step"), "pool": len(self.state.pool),
                "difficulty": self.state.difficulty,
                "batch": f"{r.queries_per_step} queries x {r.group_size} answers"}

    def start(self, stop_at: int) -> bool:
        self.gen_tokens, self.rollout_s = 0.0, 0.0
        return self.state.step >= stop_at

    def summary(self, wall_s: float, start_step: int) -> dict:
        r, st = self.rcfg, self.state
        summary = run_summary(st, self.parent, self.parent_meta.get("step"), r.max_steps, r.queries_per_step)
        if summary["steps_without_signal"] == summary["step"] and self.dist.is_main:
            log.warning("no RL step had a learning signal (%d of %d steps all unparsed or all groups flat): the RL "
                        "checkpoints equal the start checkpoint up to KL noise; see rl/parse_failure_rate",
                        summary["steps_without_signal"], summary["step"])
        summary.update({"wall_s": wall_s, "steps_run": st.step - start_step,
                        "rollout_tokens_per_s": self.gen_tokens / self.rollout_s if self.rollout_s > 0
                        else float("nan")})
        return summary


def run_rl(cfg: PipelineConfig, callbacks: list[Callback] | None = None, stop_after: int | None = None) -> dict:
    """GRPO per `cfg.rl` from the SFT checkpoint `rl.init`; with `orchestration.rl` false, an empty root and a
    summary saying so. Writes the report files on rank 0 and returns the summary."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report_dir = Path(cfg.rl.report_dir)
    if not cfg.orchestration.rl:
        root = Path(cfg.rl.out_dir)
        moved = move_aside(cfg, root, "orchestration.rl=false: this run has no RL checkpoints") \
            if ckpt.has_checkpoints(root) else None
        root.mkdir(parents=True, exist_ok=True)
        summary = {"stage": STAGE, "enabled": False, "reason": "orchestration.rl is false",
                   "moved_aside": str(moved) if moved else None}
        write_outputs(summary, [], report_dir)
        log.info("RL is off (orchestration.rl=false): %s is empty%s", root,
                 f" (the earlier RL checkpoints are in {moved})" if moved else "")
        return summary
    trainer, summary = run_module(cfg, GRPOModule(cfg), callbacks, stop_after)
    if trainer.dist.is_main:
        write_outputs(summary, trainer.module.state.history, report_dir)
    return {**summary, "history": list(trainer.module.state.history)}
