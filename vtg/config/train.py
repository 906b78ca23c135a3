"""`train`: DeepSpeed training of a Hugging Face VLM for temporal grounding."""

from typing import Literal

from pydantic import Field

from vtg.config._base import Section


class ModelConfig(Section):
    base: str = "tiny"
    """`tiny` builds a tiny Qwen2.5-VL locally; otherwise a hub id or local path of a checkpoint."""
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    """`auto`: flash_attention_2 when installed and on a GPU, else sdpa."""
    finetune: Literal["full", "lora"] = "full"
    """Full fine-tuning or LoRA adapters (peft)."""
    lora_r: int = Field(16, ge=1)
    """LoRA rank."""
    lora_alpha: int = Field(32, ge=1)
    """LoRA scaling numerator."""
    freeze_vision: bool = False
    """Freeze the vision tower."""


class TrainConfig(Section):
    model: ModelConfig = ModelConfig()
    """The model to fine-tune."""
    shards_dir: str = "data/shards"
    """Shard root written by preprocess."""
    out_dir: str = "checkpoints"
    """Checkpoint root: `step-%06d/`, `latest`, `best`."""
    seed: int = 42
    """Seeds python, numpy and torch on every rank."""
    max_steps: int = Field(1500, ge=1)
    """Optimizer steps."""
    lr: float = Field(3e-3, gt=0, le=1)
    """Peak learning rate."""
    micro_batch_size: int = Field(16, ge=1)
    """Examples per rank per micro step."""
    grad_accum: int = Field(1, ge=1)
    """Gradient accumulation steps."""
    num_gpus: int = Field(1, ge=1)
    """Ranks per node (GPUs; CPU processes over gloo when there is no GPU)."""
    zero_stage: int = Field(2, ge=0, le=3)
    """DeepSpeed ZeRO stage (0-3)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Training precision (fp32 on CPU: bf16 is ~40x slower there)."""
    save_every: int = Field(250, ge=1)
    """Checkpoint every N steps."""
    keep_last: int = Field(3, ge=1)
    """Keep the last K step checkpoints (plus best)."""
