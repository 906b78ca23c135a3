"""Shape-true models (Qwen2.5-VL, Qwen3-VL, Qwen3.5): the real widths and head layout of a hub model, depth (and
vocabulary) cut.

A shape-true model is a random-init model of the family's class whose every layer has the shapes of the
real checkpoint's layers (same hidden sizes, intermediate sizes, attention heads / KV heads, head dim, rope
sections, vision patch geometry and merger), with only a few decoder layers and vision blocks, and optionally a
cut vocabulary. The real *recipe* (LoRA on the real module names, freeze_vision, ZeRO stage, accumulation,
micro-batch, gradient checkpointing, export and reload) then runs on a CPU, and the GPU path sees the real
matrix shapes. Nothing is downloaded: the architecture facts are data in this repository.

**Architecture facts** (`vtg/model/archs/<name>.json`, one file per hub model; read by `arch_facts`, their one
home: the memory planner and the training pre-flight build on it through `training.arch.arch_for`). Qwen3-VL and
Qwen3.5 files hold `family`, `source`, `total_params` (+ its source), the published `config` verbatim and the
published `processor` / `video_processor` configs. The Qwen2.5-VL files keep an older layout, one JSON object
with field names as in the model's published `config.json`:

    hub_id        "Qwen/Qwen2.5-VL-3B-Instruct" (matched case-insensitively)
    source        where the numbers come from
    total_params  parameters of the full model (what the published safetensors hold; a cross-check)
    text          hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads
                  (head dim = hidden_size / num_attention_heads), vocab_size, tie_word_embeddings, rope_theta,
                  rope_scaling {type: mrope, mrope_section}, max_position_embeddings, rms_norm_eps, hidden_act,
                  use_sliding_window, sliding_window, max_window_layers
    vision        depth, hidden_size, num_heads, intermediate_size, patch_size, spatial_merge_size,
                  temporal_patch_size, window_size, fullatt_block_indexes, tokens_per_second, out_hidden_size,
                  in_chans, hidden_act
    token_ids     bos/eos, vision_start/vision_end, vision (pad), image and video token ids of the real tokenizer

`hub_config(facts)` renders them as the family's config of the full model (a meta-device instance of it has
exactly `total_params` parameters: tests/training/test_train_shape_true.py checks that).

**Building one**: `build_shape_true("Qwen/Qwen2.5-VL-3B-Instruct", text_layers=1, vision_blocks=1,
vocab=1024)` returns a directory (an HF export: config, safetensors, tokenizer, generation config) cached
under `.cache/tiny_models` (or `$VTG_TINY_CACHE`), built once per (hub id, depths, vocab, seed, recipe
version, facts). As a training/evaluation base: `train.model.base=shape-true:Qwen/Qwen2.5-VL-3B-Instruct`,
optionally with `?text_layers=2&vision_blocks=2&vocab=1024&seed=0` (`vtg.model.modeling.resolve_base`).

What is cut, and how the rest stays consistent:
- `num_hidden_layers` = text_layers and vision `depth` = vision_blocks. **fullatt_block_indexes** keeps the real
  full-attention blocks that still exist and always makes the last block full attention, as the real tower
  does (its last block, 31, is full): 1 block -> [0] (no windowed block left), 2 -> [1] (block 0 windowed),
  8 -> [7], 16 -> [7, 15].
- The tokenizer, with the real vocabulary (`vocab=None`, or any vocab >= `layout_size`: 151,657, Qwen3.5
  248,058), is the family's **real** one (`vtg.model.qwen_tokenizer`: Qwen's 151,643 BPE ranks, or Qwen3.5's
  248,044, rebuilt offline, the special tokens at their real ids, the published chat template with its default
  system turn where the family has one; Qwen3.5's template reconstructed), so prompts and token counts are a real
  checkpoint's. With a cut vocabulary (>= the local tokenizer's 392 tokens, e.g. 1024: fast
  CPU runs) it is the tiny byte-level BPE of `vtg.model.tiny` and the config's token ids are remapped to its
  ids. Either way the config's image/video/vision start/end, bos/eos/pad ids are the tokenizer's (checked at
  build time).
- Qwen3-VL keeps at least one deepstack tap (`cut_indexes`) and Qwen3.5 its last layer full attention
  (`cut_layer_types`), so every kind of layer the real model has keeps its real shape.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from urllib.parse import parse_qsl

from vtg.errors import ConfigError

ARCHS_DIR = Path(__file__).parent / "archs"
PREFIX = "shape-true:"
SHAPE_TRUE_VERSION = "2"  # bump when the build changes: cached builds are keyed by it (2: preprocessor_config.json)
MARKER = "shape_true_build.json"

# The real Qwen2/2.5-VL special tokens from <|endoftext|> to <|video_pad|>, in id order (151643 ... 151656).
QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]
QWEN_FIRST_SPECIAL = 151643
QWEN_LAYOUT_SIZE = QWEN_FIRST_SPECIAL + len(QWEN_SPECIALS)  # 151657: the Qwen-layout tokenizer's length
_TOKEN_ID_FIELDS = {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>",
                    "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                    "vision_token_id": "<|vision_pad|>", "image_token_id": "<|image_pad|>",
                    "video_token_id": "<|video_pad|>"}


# ---- architecture facts -------------------------------------------------------------------------------------
@functools.cache
def _all_facts() -> dict[str, dict]:
    facts = {}
    for path in sorted(ARCHS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        facts[data["hub_id"].lower()] = data
    return facts


def arch_facts(base: str) -> dict | None:
    """The architecture facts of a hub id (case-insensitive), or None when the repository has none for it.

    Only hub ids: a `shape-true:` spec or a local path gives None (a cut model's shapes are in its config)."""
    data = _all_facts().get(str(base).strip().lower())
    return json.loads(json.dumps(data)) if data is not None else None  # a copy: callers may edit it


def known_hub_ids() -> list[str]:
    return [f["hub_id"] for f in _all_facts().values()]


def _facts_or_raise(base: str) -> dict:
    facts = arch_facts(base)
    if facts is None:
        raise ConfigError(f"shape-true: no architecture facts for {base!r} (known: {', '.join(known_hub_ids())}; "
                          f"add a file to {ARCHS_DIR})")
    return facts


def _facts_digest(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


def cut_fullatt_blocks(real: list[int], depth: int) -> list[int]:
    """The real full-attention block indexes that exist at `depth`, plus the last block (see module doc)."""
    return sorted({i for i in real if i < depth} | {depth - 1})


def cut_indexes(real: list[int], depth: int) -> list[int]:
    """Qwen3-VL's deepstack taps that exist at `depth`; at least one when the real tower has any (its merger's
    shapes are the real ones)."""
    kept = [i for i in real if i < depth]
    return kept or ([depth - 1] if real else [])


def cut_layer_types(real: list[str], layers: int) -> list[str]:
    """Qwen3.5's layer pattern cut to `layers`, the last layer full attention (as every fourth real one is), so a
    cut model keeps both kinds of layer from two layers on."""
    kept = list(real[:layers])
    kept[-1] = "full_attention"
    return kept


def text_facts(facts: dict) -> dict:
    """The text model's fields in either facts layout (`config.text_config`, or Qwen2.5-VL's `text`)."""
    return facts["config"]["text_config"] if "config" in facts else facts["text"]


def vision_facts(facts: dict) -> dict:
    return facts["config"]["vision_config"] if "config" in facts else facts["vision"]


def facts_token_ids(facts: dict) -> dict[str, int]:
    """The real special-token ids under the config field names."""
    if "config" not in facts:
        return dict(facts["token_ids"])
    c, t = facts["config"], facts["config"]["text_config"]
    ids = {k: c[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")}
    return {**ids, **{k: t[k] for k in ("bos_token_id", "eos_token_id") if t.get(k) is not None}}


def _text_config(facts: dict, layers: int, vocab: int, ids: dict[str, int]) -> dict:
    t = facts["text"]
    rope = {"rope_type": "default", "rope_theta": float(t["rope_theta"]),
            "mrope_section": list(t["rope_scaling"]["mrope_section"])}
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "hidden_act",
            "max_position_embeddings", "rms_norm_eps", "use_sliding_window", "sliding_window", "max_window_layers")
    return {**{k: t[k] for k in keep}, "num_hidden_layers": layers, "vocab_size": vocab, "rope_parameters": rope,
            "bos_token_id": ids["bos_token_id"], "eos_token_id": ids["eos_token_id"],
            "pad_token_id": ids.get("pad_token_id")}


def _vision_config(facts: dict, blocks: int) -> dict:
    v = dict(facts["vision"])
    v["in_channels"] = v.pop("in_chans")
    v["fullatt_block_indexes"] = cut_fullatt_blocks(v["fullatt_block_indexes"], blocks)
    v["depth"] = blocks
    return v


def _published_config(facts: dict, text_layers: int, vision_blocks: int, vocab: int, ids: dict[str, int]):
    """A published `config.json` (Qwen3-VL, Qwen3.5 facts) at the cut depths, vocabulary and token ids."""
    from vtg.model.families import config_cls_of

    c = json.loads(json.dumps(facts["config"]))
    t, v = c["text_config"], c["vision_config"]
    t.update(num_hidden_layers=text_layers, vocab_size=vocab, bos_token_id=ids.get("bos_token_id"),
             eos_token_id=ids["eos_token_id"], pad_token_id=ids.get("pad_token_id"))
    if "layer_types" in t:
        t["layer_types"] = cut_layer_types(t["layer_types"], text_layers)
    v["depth"] = vision_blocks
    if "deepstack_visual_indexes" in v:
        v["deepstack_visual_indexes"] = cut_indexes(v["deepstack_visual_indexes"], vision_blocks)
    for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"):
        c[k] = ids[k]
    cls = config_cls_of(c.pop("model_type"))
    return cls(**c)


def _config(facts: dict, text_layers: int, vision_blocks: int, vocab: int, ids: dict[str, int]):
    if "config" in facts:
        return _published_config(facts, text_layers, vision_blocks, vocab, ids)
    from vtg.model.families import QWEN2_5_VL

    return QWEN2_5_VL.config_cls()(
        text_config=_text_config(facts, text_layers, vocab, ids), vision_config=_vision_config(facts, vision_blocks),
        image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"],
        vision_start_token_id=ids["vision_start_token_id"], vision_end_token_id=ids["vision_end_token_id"],
        tie_word_embeddings=bool(facts["text"]["tie_word_embeddings"]))


def hub_config(facts: dict):
    """The full (uncut) model's config from its facts, with the real token ids."""
    return _config(facts, text_facts(facts)["num_hidden_layers"], vision_facts(facts)["depth"],
                   text_facts(facts)["vocab_size"], facts_token_ids(facts))


# ---- tokenizer --------------------------------------------------------------------------------------------
def _tokenizer_for(vocab: int, facts: dict):
    """(tokenizer, its special-token ids under the config field names) for a model vocabulary size."""
    from vtg.model.tiny import build_tokenizer

    size = layout_size(facts)
    real_layout = facts_token_ids(facts)["video_token_id"] == size - 1  # <|video_pad|> ends the vision specials
    if vocab >= size and not real_layout:
        raise ConfigError(f"shape-true {facts['hub_id']}: its tokenizer (special tokens from id "
                          f"{facts_token_ids(facts)['vision_start_token_id']}) cannot be rebuilt offline; cut the "
                          "vocabulary (`?vocab=1024`) to use the local tokenizer")
    tok = real_tokenizer(facts) if vocab >= size else build_tokenizer()
    if vocab < len(tok):
        raise ConfigError(f"shape-true: vocab {vocab} is smaller than the local tokenizer ({len(tok)} tokens)")
    names = dict(_TOKEN_ID_FIELDS)
    if vocab >= size:  # the real tokenizer: a field keeps the special its published id names (Qwen3.5's config
        first = size - len(QWEN_SPECIALS)  # eos is <|endoftext|>, Qwen2.5-VL's <|im_end|>)
        names |= {f: QWEN_SPECIALS[i - first] for f, i in facts_token_ids(facts).items()
                  if f in names and first <= i < size}
    ids = {field: tok.convert_tokens_to_ids(name) for field, name in names.items()}
    ids["pad_token_id"] = tok.pad_token_id
    return tok, ids


def layout_size(facts: dict) -> int:
    """Where the family's real tokenizer's vision specials end (its ranks, then `<|endoftext|>` .. `<|video_pad|>`):
    151,657 for Qwen2.5-VL and Qwen3-VL, 248,058 for Qwen3.5. A vocabulary this large keeps the real tokenizer."""
    from vtg.model.families import FAMILIES

    family = FAMILIES.get(facts_family(facts))
    spec = family.tokenizer if family else None
    return (spec.first_added if spec else QWEN_FIRST_SPECIAL) + len(QWEN_SPECIALS)


def facts_family(facts: dict) -> str:
    """The family name of a facts file (the Qwen2.5-VL files predate the `family` field)."""
    from vtg.model.families import QWEN2_5_VL

    return facts.get("family", QWEN2_5_VL.name)


def real_tokenizer(facts: dict):
    """The family's real tokenizer (`vtg.model.qwen_tokenizer`: real ranks, specials at their real ids, the
    published chat template)."""
    from vtg.model.qwen_tokenizer import qwen_tokenizer

    return qwen_tokenizer(facts_family(facts))


# ---- spec and build ---------------------------------------------------------------------------------------
def is_spec(base: str) -> bool:
    return str(base).startswith(PREFIX)


_SPEC_KEYS = {"text_layers", "vision_blocks", "vocab", "seed"}


def parse_spec(spec: str) -> dict:
    """`shape-true:<hub id>[?text_layers=N&vision_blocks=N&vocab=N&seed=N]` -> build_shape_true kwargs."""
    if not is_spec(spec):
        raise ConfigError(f"not a shape-true spec: {spec!r} (expected {PREFIX}<hub id>[?key=value&...])")
    body = spec[len(PREFIX):]
    hub_id, _, query = body.partition("?")
    kwargs: dict = {"base": hub_id.strip()}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in _SPEC_KEYS:
            raise ConfigError(f"{spec!r}: unknown option {key!r} (known: {', '.join(sorted(_SPEC_KEYS))})")
        if not re.fullmatch(r"\d+", value):
            raise ConfigError(f"{spec!r}: {key} must be a non-negative integer, got {value!r}")
        kwargs[key] = int(value)
    _facts_or_raise(kwargs["base"])
    return kwargs


def _check(facts: dict, text_layers: int, vision_blocks: int) -> None:
    for name, value, real in (("text_layers", text_layers, text_facts(facts)["num_hidden_layers"]),
                              ("vision_blocks", vision_blocks, vision_facts(facts)["depth"])):
        if not 1 <= value <= real:
            raise ConfigError(f"shape-true {facts['hub_id']}: {name} must be in 1..{real}, got {value}")


def shape_true_config(base: str, text_layers: int = 1, vision_blocks: int = 1, vocab: int | None = None):
    """(config, tokenizer) of a shape-true model, without building its weights."""
    facts = _facts_or_raise(base)
    _check(facts, text_layers, vision_blocks)
    vocab = text_facts(facts)["vocab_size"] if vocab is None else int(vocab)
    tokenizer, ids = _tokenizer_for(vocab, facts)
    if vocab >= layout_size(facts):  # the real vocabulary keeps the real ids
        real = facts_token_ids(facts)
        assert all(ids[k] == real[k] for k in real), (ids, real)
    return _config(facts, text_layers, vision_blocks, vocab, ids), tokenizer


def _build_into(out: Path, facts: dict, marker: dict) -> None:
    from vtg.model.tiny import save_random_init

    config, tokenizer = shape_true_config(facts["hub_id"], marker["text_layers"], marker["vision_blocks"],
                                          marker["vocab"])
    save_random_init(config, tokenizer, out, marker["seed"])
    (out / MARKER).write_text(json.dumps(marker) + "\n")


def build_shape_true(base: str, text_layers: int = 1, vision_blocks: int = 1, vocab: int | None = None,
                     out_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) a shape-true model of hub id `base` and return its directory (an HF export).

    `vocab=None` keeps the real vocabulary size. Same arguments -> identical weights. With `out_dir=None` the
    build lands in the tiny models' cache (`$VTG_TINY_CACHE` or `.cache/tiny_models`), keyed by every argument,
    the recipe version and the facts' digest; the directory appears atomically.
    """
    from vtg.model.tiny import build_once, default_cache_dir

    facts = _facts_or_raise(base)
    _check(facts, text_layers, vision_blocks)
    marker = {"hub_id": facts["hub_id"], "text_layers": int(text_layers), "vision_blocks": int(vision_blocks),
              "vocab": text_facts(facts)["vocab_size"] if vocab is None else int(vocab), "seed": int(seed),
              "version": SHAPE_TRUE_VERSION, "facts": _facts_digest(facts)}
    key = hashlib.sha256(json.dumps(marker, sort_keys=True).encode()).hexdigest()[:10]
    name = (f"shape-true-{facts['hub_id'].split('/')[-1].lower()}-t{text_layers}-v{vision_blocks}"
            f"-voc{marker['vocab']}-s{seed}-{key}")
    out = Path(out_dir) if out_dir is not None else default_cache_dir() / name
    return build_once(out, MARKER, marker, lambda tmp: _build_into(tmp, facts, marker))


def resolve_spec(spec: str, seed: int = 0) -> Path:
    """Build (once) the model a `shape-true:` spec names; the spec's own `seed=` wins over `seed`."""
    kwargs = parse_spec(spec)
    kwargs.setdefault("seed", seed)
    return build_shape_true(**kwargs)
