"""What a model family is (`Family`) and the facts its tokenizer publishes (`TokenizerFacts`): the record each
family module under `vtg/model/families/` fills in (docs/adding-a-family.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]
HERE = Path(__file__).resolve().parent


def template(name: str) -> str:
    """The chat template `<name>.jinja` beside the family modules, byte for byte."""
    return (HERE / f"{name}.jinja").read_text()


@dataclass(frozen=True)
class RankSource:
    """Where a vocabulary's BPE ranks come from: a data file of a registry package (never imported)."""

    package: str
    requirement: str
    file: str
    n_ranks: int
    """Ranks 0..n_ranks - 1; the added tokens follow from id n_ranks."""
    regex: str
    """The pre-tokenizer's split pattern."""


@dataclass(frozen=True)
class TokenizerFacts:
    """What a family's tokenizer adds on top of its ranks (its published tokenizer_config.json)."""

    added: tuple[tuple[str, bool], ...]
    """Added tokens from id `ranks.n_ranks` on, in id order: (content, special)."""
    chat_template: str
    """The published Jinja chat template (`<family>.jinja`)."""
    model_max_length: int
    """`model_max_length` of the published tokenizer_config.json."""
    ranks: RankSource
    """The vocabulary's BPE ranks."""
    eos_token: str = "<|im_end|>"
    pad_token: str = "<|endoftext|>"

    @property
    def first_added(self) -> int:
        return self.ranks.n_ranks


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    """`config.model_type` values of the family's checkpoints."""
    config_class: str
    model_class: str
    """transformers class names (`transformers.<name>`)."""
    processor: dict = field(repr=False)
    """The published `preprocessor_config.json` (what the builders write; a loaded checkpoint's own file wins)."""
    processor_source: str
    time_encoding: str
    """`mrope`: temporal rope ids from `second_per_grid_ts` x `vision_config.tokens_per_second`; `text`: the time
    of each temporal patch written before it (`<t.t seconds>`, Qwen3-VL's processor)."""
    vision_tokens: tuple[str, str, str]
    """(vision start, video pad, vision end) of the family's tokenizer."""
    lora_text: tuple[str, ...]
    """LoRA target module names in the language model."""
    lora_vision: tuple[str, ...]
    """... and in the vision tower (used when it is not frozen)."""
    blocks: tuple[str, ...]
    """Class-name suffixes of the layers wrapped one by one (FSDP units, activation checkpointing)."""
    tokenizer: TokenizerFacts = field(repr=False)
    """The real tokenizer's published facts (`vtg.model.qwen_tokenizer` builds it from them)."""
    tiny: tuple[dict, dict] = field(repr=False)
    """(text, vision) config fields of the family's tiny model (`vtg.model.tiny`, the CPU runs)."""
    video_processor: dict | None = field(default=None, repr=False)
    """The published `video_preprocessor_config.json` (None: videos use `processor`'s facts, per frame). Its
    pixel bounds hold for the whole clip (t x h x w), as `Qwen3VLVideoProcessor.resize` applies them."""
    sampling: dict = field(default_factory=dict, repr=False)
    """The family's frame-sampling policy (fps, min_frames, max_frames) where its processor states one."""
    packable: bool = True
    """Whether packed rows are exact (`vtg.model.packing`): every text layer is attention. Qwen3.5's Gated DeltaNet
    layers carry state along the row on the torch path, so its examples cannot share one."""
    counted_from_shapes: bool = False
    """Whether the planner counts its parameters from the config's shapes (`training.arch.Arch.param_count`);
    otherwise from a meta-device instance."""
    model_classes: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    """Model types of the family whose classes differ from `config_class` / `model_class`: (config, model)."""

    def config_cls(self):
        import transformers

        return getattr(transformers, self.config_class)

    def model_cls(self):
        import transformers

        return getattr(transformers, self.model_class)

    def video_geometry(self):
        """The published video geometry (`vtg.model.geometry.Geometry`): patch sizes and pixel bounds."""
        from vtg.model.geometry import published_geometry

        return published_geometry(self.video_processor or self.processor,
                                  "video" if self.video_processor else "frame")

    @property
    def model_inputs(self) -> tuple[str, ...]:
        """The video inputs the model's forward takes besides the token tensors."""
        timing = ("second_per_grid_ts",) if self.time_encoding == "mrope" else ()
        return ("pixel_values_videos", "video_grid_thw", *timing)
