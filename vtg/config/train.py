"""`train`: DeepSpeed (or FSDP2) training of a Hugging Face VLM for temporal grounding."""

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from vtg.config._base import NOT_OUTPUT, RUN_LENGTH, Section
from vtg.config.run import RunControl


class ModelConfig(Section):
    base: str = "tiny"
    """`tiny` builds a tiny Qwen2.5-VL locally; `shape-true:<hub id>[?text_layers=N&vision_blocks=N&vocab=N]` a
    random-init model at that hub model's real widths with depth cut (vtg/model/shape_true.py); otherwise a hub
    id or local path of a checkpoint."""
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    """`auto`: flash_attention_2 when installed, on a GPU and `engine.precision` is bf16/fp16, else sdpa."""
    finetune: Literal["full", "lora", "qlora"] = "full"
    """Full fine-tuning, LoRA adapters (peft), or QLoRA: LoRA adapters over the base quantised to 4-bit NF4
    (bitsandbytes, `vtg/model/quant.py`; any engine, ZeRO-3 and FSDP shard the 4-bit weights); the adapters train in
    `engine.precision`, the export is the adapter and its quantisation config."""
    lora_r: int = Field(16, ge=1)
    """LoRA rank."""
    lora_alpha: int = Field(32, ge=1)
    """LoRA scaling numerator."""
    freeze_vision: bool = False
    """Freeze the vision tower."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""


TAUGHT = "taught"
"""`train.data.mix`'s suite keyword: what the tiny base was taught (`taught_suite`)."""


def taught_suite(teach, base_name: str) -> str | None:
    """The suite a base named `base_name` is taught before grounding (`train.teach`), or None: not a tiny base, no
    suite or no steps, or no file there (`vtg.model.teach.teach_if_tiny` says so). The one rule for both the
    teaching and the replay of what was taught (`train.data.mix`'s `suite: taught`)."""
    from vtg.model.tiny import tiny_family

    if not teach.suite or not teach.steps or not tiny_family(base_name) or not Path(teach.suite).is_file():
        return None
    return teach.suite


class MixSource(Section):
    """One source of `train.data.mix`: the grounding shards (all of them, or the queries of some declared sources)
    or a general-task suite (`vtg/general_tasks.py`'s jsonl), drawn with probability `weight` / sum of weights."""

    name: str = Field(min_length=1)
    """What the counts are logged under (`data/mix/<name>`, meta.json `data_mix`)."""
    weight: float = Field(gt=0)
    """Relative sampling weight (the shares are the weights over their sum)."""
    suite: str = ""
    """A general-task suite to replay (a `vtg/general_tasks.py` jsonl; each item encoded by the family's own encoder
    at `evaluate.forgetting.num_frames` x `frame_size`, loss on its answer only); `taught`: the suite the tiny base
    was taught (`train.teach.suite`), and for a base that is not taught (a real checkpoint, `train.teach.steps=0`,
    no suite file) the entry is left out (name a general suite of your own to replay one); empty: the grounding
    shards of `train.shards_dir`."""
    sources: list[str] = Field(default_factory=list)
    """Grounding only: keep the queries of these declared source ids (`ingest.sources`); empty: every source."""


class DataConfig(Section):
    split: str = "train"
    """Shard split to train on (`<shards_dir>/<split>/shard-*.tar`)."""
    num_workers: int = Field(1, ge=0)
    """DataLoader worker processes decoding frames (0: in the training process)."""
    prefetch_factor: int = Field(2, ge=1, json_schema_extra=NOT_OUTPUT)
    """Batches each worker prepares ahead."""
    shuffle_buffer: int = Field(256, ge=1)
    """Examples held in the shuffle buffer (per worker)."""
    resampled: bool = True
    """Repeat the shard list forever, reshuffled each epoch (multi-epoch; `max_steps` ends the run)."""
    token_budget: int = Field(0, ge=0)
    """Max tokens per micro-batch (short sequences in bigger batches, up to micro_batch_size): padded tokens
    (examples x the longest), or with `packing` the examples' own tokens; 0: off."""
    packing: bool = False
    """Lay a micro-batch's examples end to end in rows instead of padding each to the longest (`vtg/model/packing.py`):
    each keeps its own positions (the family's rope and time positions) and attends only to itself, so loss and
    gradients equal the padded batch's (fp32 tolerance). Needs `token_budget` (a micro-batch's tokens; at most
    `micro_batch_size` examples); `length_groups` micro-batches' worth are packed together (first fit decreasing),
    0: one at a time in stream order. One row per micro-batch with flash-attn (varlen); with sdpa/eager rows as long
    as the pool's longest example (or `pack_length`). Not for Qwen3.5 (linear-attention layers)."""
    pack_length: int = Field(0, ge=0)
    """`packing` with sdpa/eager: the shortest row in tokens (0: the pool's longest example). Longer rows hold more
    short examples but cost more masked attention (row length squared)."""
    length_groups: int = Field(0, ge=0)
    """Batch examples of similar length: sort each `length_groups` x `micro_batch_size` shuffled examples by length,
    cut them into batches (under `token_budget`), shuffle the batches. Removes most padding where lengths vary
    (`preprocess.frame_mode: family`, real videos); 0: batches in stream order."""
    auto_share: float | None = Field(None, ge=0, le=1)
    """Share of SFT's examples drawn from auto-labelled queries (`auto:` sources, the annotate stage); the rarer side
    is kept whole and the other thinned. null: every query as it comes; 0: auto labels are not trained on."""
    max_seq_len: int = Field(2048, ge=16)
    """Longest example in tokens; a longer one would truncate its answer and is skipped (and fails sanity checks)."""
    timestamps: Literal["native", "text"] = "native"
    """How frame times reach the model: `native` is the family's own way (Qwen2.5-VL: its temporal rope positions
    from `second_per_grid_ts`; Qwen3-VL/3.5: text); `text` writes each temporal patch's time before it
    (`<7.2 seconds>`, as Qwen3-VL's processor does) for every family. Recorded in the export's tokenizer config."""
    query_position: Literal["before", "after"] = "before"
    """Where the query text goes in the user turn: `after` the video (Qwen's usual order) or `before` it, so the
    video tokens can attend to the query (causal attention; measured: +0.08-0.1 val R@1@0.5 on the tiny model).
    Recorded in the export's tokenizer config."""
    sanity_examples: int = Field(32, ge=1)
    """Examples checked before step 1 (answer mask, labels, lengths)."""
    mix: list[MixSource] = Field(default_factory=lambda: [MixSource(name="grounding", weight=0.8),
                                                          MixSource(name="general", weight=0.2, suite=TAUGHT)])
    """Multi-source mixing (LLaMA-Factory's `interleave_probs`, ms-swift's sampling ratios): named sources with
    weights. The default replays what the base was taught (`suite: taught`) in 20% of SFT's examples, so that
    grounding does not erase it (docs/results.md, issue 41: retention 0.00 without replay; 10% kept 0.85 in one
    seed of three, 20% >= 0.99 in all three, with SFT R@1@0.5 >= 0.9 in each). Each stream position draws
    its source from a seeded generator (per rank and worker), so a resume is bit-exact at any world size; the
    counts per source reach the log, meta.json and MLflow. Empty (or only grounding left): the grounding shards
    alone."""

    @model_validator(mode="after")
    def _check_mix(self):
        names = [m.name for m in self.mix]
        if len(set(names)) != len(names):
            raise ValueError(f"data.mix: source names must be unique (got {names})")
        if self.mix and not any(not m.suite for m in self.mix):
            raise ValueError("data.mix needs at least one grounding source (an entry without `suite`)")
        for m in self.mix:
            if m.suite and m.sources:
                raise ValueError(f"data.mix {m.name!r}: `sources` selects grounding queries; a suite has none")
        return self

    @model_validator(mode="after")
    def _check_packing(self):
        if self.packing and not self.token_budget:
            raise ValueError("data.packing=true needs data.token_budget > 0: the tokens one micro-batch packs "
                             "(e.g. micro_batch_size x a typical example's length)")
        return self


class GuardConfig(Section):
    spike_ratio: float = Field(5.0, gt=1)
    """Skip a batch whose loss exceeds this multiple of the running mean loss."""
    ema_beta: float = Field(0.95, ge=0, lt=1)
    """Smoothing of the running mean loss."""
    min_steps: int = Field(20, ge=0)
    """Steps before spike detection starts (the running mean needs history)."""
    max_consecutive_skips: int = Field(20, ge=1)
    """Abort the run after this many skipped batches in a row (the run has diverged)."""


class TeachConfig(Section):
    suite: str = "data/raw/synthetic/general/teach_all.jsonl"
    """General-task items (`vtg.general_tasks` format) a tiny base (`tiny`, `tiny-qwen3_vl`, ...) is first taught,
    standing in for the pre-training a real checkpoint had, so that forgetting can be measured
    (`evaluate.forgetting`); `vtg/model/teach.py`, cached like the tiny models. Ignored for any other base. Empty, or
    a file that does not exist (a warning says so): the tiny base is not taught."""
    steps: int = Field(1200, ge=0)
    """AdamW steps of teaching (0: not taught); a suite of several tasks is taught in batches shared equally among
    them. Default corpus: 1,436 colour and 3,270 presence items, 1,200 steps ~2 min on two CPU cores, held-out
    accuracy 0.98 on both tasks (600 steps: colour 0.23)."""
    lr: float = Field(3e-3, gt=0, le=1)
    """Peak learning rate (linear warmup over the first tenth)."""
    batch_size: int = Field(16, ge=1)
    """Items per step."""
    seed: int = 0
    """Seed of the item order."""


class TrainConfig(RunControl):
    model: ModelConfig = ModelConfig()
    """The model to fine-tune."""
    teach: TeachConfig = TeachConfig()
    """The general task a tiny base is taught before grounding (what forgetting is measured on)."""
    data: DataConfig = DataConfig()
    """Streaming shards into batches."""
    guards: GuardConfig = GuardConfig()
    """Stability guards: NaN/inf and loss-spike batches are skipped on every rank."""
    shards_dir: str = "data/shards"
    """Shard root written by preprocess."""
    out_dir: str = Field("checkpoints/sft", json_schema_extra=NOT_OUTPUT)
    """SFT checkpoint root: `step-%06d/` and `latest` (RL writes beside it, in `rl.out_dir`)."""
    max_steps: int = Field(1500, ge=1, json_schema_extra=RUN_LENGTH)
    """Optimizer steps."""
    lr: float = Field(3e-3, gt=0, le=1)
    """Peak learning rate."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Cosine decay ends at lr x this."""
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    """Linear warmup over this fraction of max_steps."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, ge=0)
    """Gradient clipping by global norm (0: off)."""
    micro_batch_size: int = Field(16, ge=1)
    """Examples per rank per micro step (the upper bound when data.token_budget is on)."""
    grad_accum: int = Field(1, ge=1)
    """Gradient accumulation steps."""
    num_gpus: int = Field(1, ge=1)
    """Ranks per node (GPUs; CPU processes over gloo when there is no GPU)."""
    gpu_mem_gb: float = Field(80.0, gt=0, json_schema_extra=NOT_OUTPUT)
    """Memory of each declared GPU in GiB: the pre-flight (`python -m training.preflight`, also run before
    training) checks model states + activations of the longest example per GPU against it."""
    zero_stage: int = Field(2, ge=0, le=3)
    """DeepSpeed ZeRO stage (0-3)."""
    peak_tflops: float = Field(0.0, ge=0, json_schema_extra=NOT_OUTPUT)
    """Peak bf16 TFLOP/s of one device, the MFU denominator; 0: by GPU name (H100/H200 989, A100 312), and on
    a CPU or an unknown GPU no MFU is logged."""
    save_every: int = Field(500, ge=1, json_schema_extra=RUN_LENGTH)
    """Checkpoint every N steps."""
    early_stop: bool = Field(False, json_schema_extra=RUN_LENGTH)
    """End SFT cleanly on the overfitting signal: after each checkpoint training scores it on its own val split
    (`shards_dir`; the answer tokens' teacher-forced loss, as the evaluate stage computes `eval_loss`) and the
    run stops once that loss rose at `early_stop_patience` consecutive checkpoints while the training loss fell
    (training/early_stop.py; the decision is kept in `<out_dir>/early_stop.json`, so a rerun does not train on)."""
    early_stop_patience: int = Field(3, ge=1, json_schema_extra=RUN_LENGTH)
    """With `early_stop`: how many consecutive rising val losses end the run (the evaluate stage's report warns
    on its own `evaluate.overfit_patience`)."""

    def mix_sources(self) -> list[MixSource]:
        """`data.mix` as trained on: `suite: taught` becomes `teach.suite` where the base is taught, else the entry
        goes (a mix left with one unfiltered grounding source is no mix). Every reader of the mix takes it from
        here; params.yaml and the run key keep the keyword."""
        if not any(m.suite == TAUGHT for m in self.data.mix):
            return list(self.data.mix)
        suite = taught_suite(self.teach, self.model.base)
        mix = [m.model_copy(update={"suite": suite}) if m.suite == TAUGHT else m
               for m in self.data.mix if m.suite != TAUGHT or suite]
        return [] if len(mix) == 1 and not mix[0].suite and not mix[0].sources else mix
