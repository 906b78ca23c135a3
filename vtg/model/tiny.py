"""Tiny models of each family (same architecture, random init) and a locally trained tokenizer, for CPU runs.

`tiny` is a tiny model of the default family (Qwen2.5-VL), `tiny-<family>` one of another; each family's recipe
(its `Family.tiny`, in `vtg/model/families/<family>.py`): Qwen2.5-VL text 64 wide x 2 layers, 4 heads / 2 KV heads,
`mrope_section` [4, 2, 2], vision 32 wide x 2 blocks, patch 14; Qwen3-VL the same widths with 4 layers (head dim
16, interleaved `mrope_section` [2, 3, 3]; patch 16, one deepstack layer); Qwen3.5 3 Gated DeltaNet layers + 1
full-attention layer. All share a byte-level BPE (~390
tokens, single digits) with the Qwen-VL special tokens and a chat template, and write their family's published
processor configs (patch geometry their own). Built deterministically from `seed` and saved with
`save_pretrained`, so they reload like any hub checkpoint. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from vtg.io import exclusive

log = logging.getLogger(__name__)

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
VIDEO_TOKEN = "<|video_pad|>"
IMAGE_TOKEN = "<|image_pad|>"

# Qwen2-VL style: a video/image content item becomes <|vision_start|><|video_pad|><|vision_end|>; the
# single pad token is expanded to the real number of visual tokens by `vtg.model.processing.encode_example`.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)



def tiny_recipes() -> dict[str, tuple[dict, dict]]:
    """(text, vision) config fields of each family's tiny model (`Family.tiny`, in its module)."""
    from vtg.model.families import FAMILIES

    return {name: f.tiny for name, f in FAMILIES.items()}


def _default() -> str:
    from vtg.model.families import DEFAULT

    return DEFAULT.name


TINY_PREFIX = "tiny"
TINY_VERSION = "4"  # bump when a recipe changes: cached builds are keyed by it (4: tiny Qwen3-VL has 4 layers)


def _tokenizer_corpus() -> list[str]:
    """Text the tiny BPE is trained on: chat scaffolding, answers, and the words grounding queries use."""
    words = ("the a an of in on at to from and then with is are was appears moves enters leaves shows person "
             "red green blue yellow orange purple white black cyan magenta grey gray square circle ball box "
             "disk bar shape object thing stripe flash light dark bright moving jumping left right up down "
             "top bottom center when does happen where video frame second seconds scene event query which "
             "time start end begins ends first last one two small large big slowly quickly appear visible")
    lines = [f"<|im_start|>user\nWhen does {w} happen?<|im_end|>\n<|im_start|>assistant\n" for w in words.split()]
    lines += [f"{s}.{d} - {e}.{d} seconds" for s in range(0, 60, 7) for e in range(1, 90, 11) for d in range(10)]
    lines += [words, words.title(), words.upper()]
    return lines


def build_tokenizer(seed: int = 0):
    """A byte-level BPE (single digits) with the Qwen-VL special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    del seed  # BPE training is deterministic for a fixed corpus; kept for a uniform signature
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=392, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:], model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_family(base: str) -> str | None:
    """The family of a tiny base name (`tiny`: Qwen2.5-VL, `tiny-<family>`), None for any other base."""
    if base == TINY_PREFIX:
        return _default()
    family = base.removeprefix(TINY_PREFIX + "-") if base.startswith(TINY_PREFIX + "-") else None
    if family is not None and family not in tiny_recipes():
        from vtg.errors import ConfigError

        raise ConfigError(f"{base!r}: no tiny recipe for family {family!r} (known: "
                          f"{', '.join(TINY_PREFIX + '-' + f for f in tiny_recipes())})")
    return family


def tiny_config(tokenizer, text: dict | None = None, vision: dict | None = None, family: str | None = None):
    """The family's tiny recipe's config (or a bigger one: `text`/`vision` override the recipe's fields)."""
    from vtg.model.families import family_named

    family = family or _default()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    base_text, base_vision = family_named(family).tiny
    text = dict(base_text, **(text or {}), vocab_size=len(tokenizer), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return family_named(family).config_cls()(
        text_config=text, vision_config=dict(base_vision, **(vision or {})), image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )


def save_random_init(config, tokenizer, out_dir: Path, seed: int) -> None:
    """A seeded random-init model of `config` (its family's class) with greedy generation defaults, saved with
    `tokenizer` and the family's published processor configs (the tiny and the shape-true builders end here)."""
    import torch
    from transformers import GenerationConfig

    from vtg.model.families import model_cls_of

    torch.manual_seed(seed)
    model = model_cls_of(config)(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id, pad_token_id=config.text_config.pad_token_id,
        do_sample=False, max_new_tokens=16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    from vtg.model.families import family_of
    from vtg.model.processing import VisionParams, published_processor_files

    geometry = VisionParams.from_model_config(config)
    for name, data in published_processor_files(family_of(config), geometry).items():
        (Path(out_dir) / name).write_text(json.dumps(data, indent=2) + "\n")


def _build_into(out_dir: Path, seed: int, family: str) -> None:
    tokenizer = build_tokenizer(seed)
    save_random_init(tiny_config(tokenizer, family=family), tokenizer, out_dir, seed)
    (out_dir / "tiny_build.json").write_text(json.dumps(_marker(seed, family)) + "\n")


def _marker(seed: int, family: str) -> dict:
    marker = {"seed": seed, "version": TINY_VERSION}
    return marker if family == _default() else {**marker, "family": family}


def default_cache_dir() -> Path:
    env = os.environ.get("VTG_TINY_CACHE")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".cache" / "tiny_models"


def build_tiny_model(out_dir: str | Path | None = None, seed: int = 0, family: str | None = None) -> Path:
    """Build (once) the family's tiny model + tokenizer and return its directory (an HF export).

    With `out_dir=None` the build lands in a cache keyed by (recipe version, seed) under `.cache/tiny_models`
    (or `$VTG_TINY_CACHE`), so repeated calls and tests reuse it. Same seed -> identical weights. The directory
    appears atomically (built in a temp dir, then renamed), so concurrent builders never see half a model.
    """
    family = family or _default()
    out = Path(out_dir) if out_dir is not None else tiny_model_dir(seed, family)
    return build_once(out, "tiny_build.json", _marker(seed, family), lambda tmp: _build_into(tmp, seed, family))


def tiny_model_dir(seed: int = 0, family: str | None = None) -> Path:
    """Where `build_tiny_model` caches the family's tiny model of `seed` (built or not)."""
    family = family or _default()
    if family not in tiny_recipes():
        raise ValueError(f"no tiny recipe for family {family!r} (known: {', '.join(tiny_recipes())})")
    suffix = "" if family == _default() else f":{family}"
    key = hashlib.sha256(f"{TINY_VERSION}:{seed}{suffix}".encode()).hexdigest()[:10]
    return default_cache_dir() / (f"tiny-s{seed}-{key}" if not suffix else f"tiny-{family}-s{seed}-{key}")


def tiny_tokenizer(family: str | None = None, seed: int = 0):
    """The tiny model's tokenizer without building the model (so without torch): loaded from the cached build
    when there is one, else trained again (`build_tokenizer` is deterministic: the same vocabulary and merges,
    `tests/vtg/model/test_modeling.py`). Ingest counts query tokens with it in a process that never imports torch."""
    out = tiny_model_dir(seed, family)
    if (out / "tiny_build.json").is_file():
        from transformers import PreTrainedTokenizerFast  # AutoTokenizer would import torch

        return PreTrainedTokenizerFast.from_pretrained(out)
    return build_tokenizer(seed)


def build_once(out: Path, marker_name: str, marker_content: dict, build_into) -> Path:
    """`out` if its marker file holds `marker_content`, else `build_into(tmp)` in a temp dir beside it (which
    must write the marker) and an atomic rename, so concurrent builders never see half a model."""
    marker = out / marker_name

    def built() -> bool:
        return marker.is_file() and json.loads(marker.read_text()) == marker_content

    if built():
        return out

    def waiting(seconds: float | None) -> None:
        if seconds is None:
            log.info("%s: another process is building it; waiting", out)
        else:
            log.info("%s: waited %.0f s for the other builder", out, seconds)

    # one builder at a time (the flow's background `training.prepare_base` and a train stage that starts while it
    # teaches, two test workers): the second waits, then finds the first one's build instead of doing it again
    with exclusive(out.parent / f".{out.name}.lock", on_wait=waiting):
        if built():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            build_into(tmp)
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        except OSError:
            if not marker.is_file():  # a concurrent builder (of another lock's era) did not win either
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
