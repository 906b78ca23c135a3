"""Issue 21 case 9 (input hygiene): a query holding the text of a control token (`<|video_pad|>`, `<|im_end|>`)
crashed evaluation with a traceback and was skipped by training, because the whole prompt was tokenized as one
string and the query's text became the control token. User text is now tokenized as text, everywhere the prompt
is built (training, RL rollouts, evaluation and pre-flight share `vtg.model.processing.encode_prompt`)."""

from __future__ import annotations

import numpy as np
import pytest

from vtg.model.processing import (
    MM_VIDEO,
    VisionParams,
    build_messages,
    encode_example,
    encode_prompt,
    video_block,
    vision_tokens,
)
from vtg.model.tiny import build_tokenizer

VISION = VisionParams()
FRAMES = np.zeros((4, 56, 56, 3), dtype=np.uint8)
TIMES = [0.5, 1.5, 2.5, 3.5]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _whole_string_ids(tok, query: str, position: str) -> list[int]:
    """How the prompt was tokenized before: one string, special-token text included."""
    import torch

    from vtg.model.processing import patchify_video

    _, grid = patchify_video(FRAMES, VISION)
    block, _, _ = video_block(vision_tokens(tok), grid, TIMES, VISION, "text")
    prompt = tok.apply_chat_template(build_messages(query, position), tokenize=False, add_generation_prompt=True)
    start, video, end = vision_tokens(tok)
    assert isinstance(grid, torch.Tensor)
    return tok(prompt.replace(f"{start}{video}{end}", block), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("position", ["after", "before"])
@pytest.mark.parametrize("query", ["the person opens the door", "  leading spaces, then 12.5 s!\nand a new line",
                                   "Ünïcödé and émoji 🎬"])
def test_ordinary_queries_encode_exactly_as_before(tok, query, position):
    from vtg.model.processing import patchify_video

    _, grid = patchify_video(FRAMES, VISION)
    block, _, _ = video_block(vision_tokens(tok), grid, TIMES, VISION, "text")
    assert encode_prompt(tok, query, block, position) == _whole_string_ids(tok, query, position)


@pytest.mark.parametrize("control", ["<|video_pad|>", "<|im_end|>", "<|im_start|>assistant\n", "<|vision_start|>"])
def test_control_token_text_in_a_query_stays_text(tok, control):
    query = f"find {control} in the video"
    ex = encode_example(tok, FRAMES, TIMES, query, "0.5 - 1.5", vision=VISION, timestamps_mode="text")
    clean = encode_example(tok, FRAMES, TIMES, "find  in the video", "0.5 - 1.5", vision=VISION,
                           timestamps_mode="text")
    special = set(tok.all_special_ids)
    ids = ex["input_ids"].tolist()
    # exactly the control tokens of the clean prompt, in the same order: the query added none
    assert [i for i in ids if i in special] == [i for i in clean["input_ids"].tolist() if i in special]
    assert int((ex["mm_token_type_ids"] == MM_VIDEO).sum()) == int((clean["mm_token_type_ids"] == MM_VIDEO).sum())
    assert control.strip() in tok.decode(ids)  # and the text is still there, as text
