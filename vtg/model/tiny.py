"""A tiny Qwen2.5-VL (same architecture, random init) and a locally trained tokenizer, for CPU runs and tests.

The recipe is docs/environment.md's: text 64 wide x 2 layers, 4 heads / 2 KV heads, `mrope_section` [4, 2, 2];
vision 32 wide x 2 blocks, patch 14, merge 2, temporal patch 2; a byte-level BPE (~390 tokens, single digits)
with the Qwen-VL special tokens and a chat template. Built deterministically from `seed` and saved with
`save_pretrained`, so it reloads like any hub checkpoint. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

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

TINY_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}
TINY_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2,
                   "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1], "tokens_per_second": 2,
                   "out_hidden_size": 64}
TINY_VERSION = "2"  # bump when the recipe changes: cached builds are keyed by it (2: preprocessor_config.json)


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


def tiny_config(tokenizer, text: dict | None = None, vision: dict | None = None):
    """The tiny recipe's config (or a bigger one: `text`/`vision` override the recipe's fields)."""
    from vtg.model.families import QWEN2_5_VL

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(TINY_TEXT, **(text or {}), vocab_size=len(tokenizer), bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    return QWEN2_5_VL.config_cls()(
        text_config=text, vision_config=dict(TINY_VISION, **(vision or {})), image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN], vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
    )


def save_random_init(config, tokenizer, out_dir: Path, seed: int) -> None:
    """A seeded random-init Qwen2.5-VL of `config` with greedy generation defaults, saved with `tokenizer`
    (the tiny and the shape-true builders both end here)."""
    import torch
    from transformers import GenerationConfig

    from vtg.model.families import family_of

    torch.manual_seed(seed)
    model = family_of(config).model_cls()(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id, pad_token_id=config.text_config.pad_token_id,
        do_sample=False, max_new_tokens=16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    from vtg.model.processing import PROCESSOR_CONFIG, VisionParams  # the real Qwen2.5-VL processor facts

    facts = VisionParams.from_model_config(config).to_processor_config()
    (Path(out_dir) / PROCESSOR_CONFIG).write_text(json.dumps(facts, indent=2) + "\n")


def _build_into(out_dir: Path, seed: int) -> None:
    tokenizer = build_tokenizer(seed)
    save_random_init(tiny_config(tokenizer), tokenizer, out_dir, seed)
    (out_dir / "tiny_build.json").write_text(json.dumps({"seed": seed, "version": TINY_VERSION}) + "\n")


def default_cache_dir() -> Path:
    env = os.environ.get("VTG_TINY_CACHE")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".cache" / "tiny_models"


def build_tiny_model(out_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once) the tiny Qwen2.5-VL + tokenizer and return its directory (an HF export).

    With `out_dir=None` the build lands in a cache keyed by (recipe version, seed) under `.cache/tiny_models`
    (or `$VTG_TINY_CACHE`), so repeated calls and tests reuse it. Same seed -> identical weights. The directory
    appears atomically (built in a temp dir, then renamed), so concurrent builders never see half a model.
    """
    key = hashlib.sha256(f"{TINY_VERSION}:{seed}".encode()).hexdigest()[:10]
    out = Path(out_dir) if out_dir is not None else default_cache_dir() / f"tiny-s{seed}-{key}"
    return build_once(out, "tiny_build.json", {"seed": seed, "version": TINY_VERSION},
                      lambda tmp: _build_into(tmp, seed))


def build_once(out: Path, marker_name: str, marker_content: dict, build_into) -> Path:
    """`out` if its marker file holds `marker_content`, else `build_into(tmp)` in a temp dir beside it (which
    must write the marker) and an atomic rename, so concurrent builders never see half a model."""
    marker = out / marker_name
    if marker.is_file() and json.loads(marker.read_text()) == marker_content:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build_into(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError:
        if not marker.is_file():  # a concurrent builder did not win either
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
