"""The architecture model the memory planner and the pre-flight count with (no weights needed): `Arch`, a
VLM's text and vision shapes from its config, and `arch_for`, which finds them for a base (a local export, `tiny`,
`shape-true:` specs, the facts in vtg/model/archs, or a hub id in the local cache)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vtg.model.tokens import own_tokenizer


def _default_model_type() -> str:
    from vtg.model.families import DEFAULT

    return DEFAULT.model_types[0]


@dataclass(frozen=True)
class Arch:
    """A VLM architecture as its config's `text_config` / `vision_config` fields (no weights needed)."""

    text: dict
    vision: dict
    tie_word_embeddings: bool = False
    model_type: str = field(default_factory=lambda: _default_model_type())
    """The config's `model_type` (`vtg.model.families`; default: the default family's): a family with
    `counted_from_shapes` (Qwen2.5-VL) is counted from its shapes, the others from a meta-device instance."""

    @classmethod
    def from_config_json(cls, config: dict) -> Arch:
        """A `config.json` (transformers 5 nests `text_config`; older exports keep the text fields on top)."""
        text = config.get("text_config") or config
        return cls(text, config["vision_config"],
                   bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                   config.get("model_type", _default_model_type()))

    @classmethod
    def from_facts(cls, facts: dict) -> Arch:
        """The model folder's architecture facts (`vtg.model.shape_true.arch_facts`): a published `config`, or
        (the Qwen2.5-VL files) text and vision fields."""
        if "config" in facts:
            return cls.from_config_json(facts["config"])
        return cls(facts["text"], facts["vision"], bool(facts["text"].get("tie_word_embeddings", False)))

    @classmethod
    def from_hf_config(cls, config) -> Arch:
        return cls.from_config_json({"text_config": config.text_config.to_dict(),
                                     "vision_config": config.vision_config.to_dict(),
                                     "tie_word_embeddings": config.tie_word_embeddings,
                                     "model_type": config.model_type})

    @property
    def family(self):
        from vtg.model.families import family_of

        return family_of(self.model_type)

    def __getattr__(self, name: str):
        key = _ARCH_FIELDS.get(name)
        if key is None:
            raise AttributeError(name)
        part, field = key
        return getattr(self, part)[field]

    def param_count(self) -> tuple[float, float]:
        """(total parameters, largest single parameter) of `Qwen2_5_VLForConditionalGeneration`, counted from the
        shapes (equals a meta-device instance and the published safetensors: tests/training/test_train_plan.py);
        other families: counted on a meta-device instance."""
        if not self.family.counted_from_shapes:
            from vtg.model.families import meta_param_count

            return meta_param_count(self.model_type, self.text, self.vision, self.tie_word_embeddings)
        h, i, a, V = self.hidden, self.intermediate, self.heads, self.vocab
        kv = self.text["num_key_value_heads"] * (h // a)
        layer = h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h  # q,k,v (+bias), o, gated MLP, 2 norms
        text = V * h + self.layers * layer + h + (0 if self.tie_word_embeddings else V * h)
        w, p, tp = self.vision_hidden, self.patch_size, self.temporal_patch_size
        mm = w * self.merge_size ** 2
        return float(text + self.vision_param_count()), float(max(V * h, h * i, mm * mm, 3 * tp * p * p * w))

    def quantized_count(self) -> tuple[float, int]:
        """(elements, tensors) of the weights a 4-bit (QLoRA) load quantises: `vtg.model.quant`'s rule, which is
        transformers', applied to a meta-device instance."""
        from vtg.model.quant import meta_quantized_weights

        return meta_quantized_weights(self.model_type, self.text, self.vision, self.tie_word_embeddings)

    def vision_param_count(self) -> float:
        """The vision tower: 3-D patch conv, blocks (2 norms, qkv + proj with biases, gated MLP), 2x2 merger."""
        w, iv, p, tp = self.vision_hidden, self.vision_intermediate, self.patch_size, self.temporal_patch_size
        mm, out = w * self.merge_size ** 2, self.vision["out_hidden_size"]
        block = 2 * w + 3 * w * w + 3 * w + w * w + w + 2 * (w * iv + iv) + iv * w + w
        return float(3 * tp * p * p * w + self.vision_depth * block + w + mm * mm + mm + mm * out + out)


_ARCH_FIELDS = {
    "hidden": ("text", "hidden_size"), "layers": ("text", "num_hidden_layers"),
    "heads": ("text", "num_attention_heads"), "intermediate": ("text", "intermediate_size"),
    "vocab": ("text", "vocab_size"), "vision_hidden": ("vision", "hidden_size"),
    "vision_depth": ("vision", "depth"), "vision_heads": ("vision", "num_heads"),
    "vision_intermediate": ("vision", "intermediate_size"), "patch_size": ("vision", "patch_size"),
    "merge_size": ("vision", "spatial_merge_size"), "temporal_patch_size": ("vision", "temporal_patch_size"),
}


def _hf_cached_config(base: str) -> str | None:
    """The config.json of a hub id already in the local Hugging Face cache (no network), else None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(base, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id (a path, `tiny`): nothing cached under it
        return None
    return found if isinstance(found, str) else None


def arch_for(base: str) -> tuple[Arch, str, object] | None:
    """(architecture, where it came from, tokenizer or None) without weights or network; None if unknown.

    `tiny` and local directories: their `config.json` (and their tokenizer). `shape-true:` specs: the cut
    model's config (vtg/model/shape_true.py), not built. Hub ids: the Hugging Face cache's config.json when the
    model was downloaded before (with its tokenizer when cached too), else the model folder's architecture facts
    (`vtg.model.shape_true.arch_facts`, the files in `vtg/model/archs/`; no tokenizer: callers use the local one).
    """
    from vtg.model import shape_true
    from vtg.model.modeling import resolve_base

    if shape_true.is_spec(base):
        kw = shape_true.parse_spec(base)
        config, tokenizer = shape_true.shape_true_config(kw["base"], kw.get("text_layers", 1),
                                                         kw.get("vision_blocks", 1), kw.get("vocab"))
        return Arch.from_hf_config(config), f"shape-true config of {kw['base']}", tokenizer
    path = Path(resolve_base(base))
    if (path / "config.json").is_file():
        return (Arch.from_config_json(json.loads((path / "config.json").read_text())), f"{path}/config.json",
                own_tokenizer(base))
    if (cached := _hf_cached_config(base)) is not None:  # its tokenizer too, when the cache has its files
        return (Arch.from_config_json(json.loads(Path(cached).read_text())), "Hugging Face cache config.json",
                own_tokenizer(base))
    facts = shape_true.arch_facts(base)
    if facts is None:
        return None
    return Arch.from_facts(facts), f"vtg/model/archs ({facts['hub_id']})", None
