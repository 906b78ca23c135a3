"""Turn (frames, timestamps, query, answer) into a Qwen VLM's inputs, without transformers' video processor.

transformers' video processor needs torchvision, which cannot live beside the CPU torch here (docs/environment.md), so
the patchify step is ours: resize to a multiple of patch x merge within the pixel bounds (PIL bicubic, as
`Qwen2VLImageProcessor` does), rescale, normalise with the mean/std, and the same (t, h, w) -> (merged patch)
reshape. It matches `Qwen2VLImageProcessor` exactly (tests/vtg/model/test_processing.py, test_family_parity.py).

The processor facts (patch, merge and temporal patch sizes, pixel bounds, mean/std) are the checkpoint's own:
`VisionParams.from_model` reads the `preprocessor_config.json` next to the weights the model was loaded from
(a checkpoint without one is an error, never a silent default), and every export keeps a copy
(`save_processor_config`), so training, RL, evaluation and serving all patchify the way the model was trained.

Timing reaches the model from the frame timestamps actually sampled (presentation times from the answer's origin,
`vtg.clock`; never a configured fps): for Qwen2.5-VL's native timing as `position_ids`, each temporal patch's rope
id from its frames' mean time (`vtg.model.rope_time`), with `second_per_grid_ts` (seconds spanned by one temporal
patch) beside them for a caller that lets transformers build the ids. `mm_token_type_ids` marks the video tokens
(2) so that transformers 5 builds 3-D rope positions (without it the model silently falls back to 1-D positions).

The family (`vtg.model.families`) decides the rest: Qwen2.5-VL's pixel bounds hold per frame and its time is
the rope (`second_per_grid_ts`); Qwen3-VL's and Qwen3.5's bounds hold for the whole clip (their
`video_preprocessor_config.json`) and their time is text, `<t.t seconds>` before each temporal patch, t the mean
of the patch's first and last frame time (`Qwen3VLProcessor._calculate_timestamps`). Parity with transformers'
own functions: tests/training/test_family_parity.py.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from vtg.answer import format_answer
from vtg.model.families import DEFAULT
from vtg.model.geometry import Geometry, resized_size
from vtg.model.processor_facts import (  # noqa: F401 - the facts' names, re-exported for the callers of this module
    CLIP_MEAN,
    CLIP_STD,
    PROCESSOR_CONFIG,
    QWEN25VL_PROCESSOR,
    VIDEO_PROCESSOR_CONFIG,
    VisionParams,
    processor_config_path,
    published_processor_files,
    save_processor_config,
)
from vtg.model.rope_time import rope_positions
from vtg.model.shared_vision import video_share
from vtg.model.text import query_ids

MM_TEXT, MM_IMAGE, MM_VIDEO = 0, 1, 2
IGNORE_INDEX = -100
QWEN25VL_FACTS = VisionParams()
"""Qwen2.5-VL's published facts: the default where a caller builds inputs without a loaded model."""


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of `factor`, pixels within [min, max], aspect kept."""
    return resized_size(1, height, width, Geometry(factor, 1, 1, min_pixels, max_pixels))


def frame_size_for(num_frames: int, height: int, width: int, vp: VisionParams) -> tuple[int, int]:
    """The (height, width) every frame of a clip is resized to: per frame within the pixel bounds
    (`pixel_scope="frame"`), or the clip's t x h x w within them (`"video"`, Qwen3-VL's video `smart_resize`)."""
    return resized_size(num_frames, height, width, vp.geometry)


def _resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    if frames.shape[1:3] == (height, width):
        return frames
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), resample=Image.BICUBIC))
                     for f in frames])


@functools.cache
def _normalize_table(mean: tuple[float, ...] = CLIP_MEAN, std: tuple[float, ...] = CLIP_STD) -> torch.Tensor:
    """[3, 256] float32: the normalised value of every uint8 level per channel."""
    levels = (torch.arange(256, dtype=torch.float64) * (1 / 255)).to(torch.float32)
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1)
    return (levels.view(1, 256) - m) / s


def patchify_video(frames: np.ndarray, vp: VisionParams = QWEN25VL_FACTS) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 RGB frames [T, H, W, 3] -> (pixel_values_videos [N, C*tp*p*p] float32, video_grid_thw [1, 3]).

    Frames are padded to a multiple of the temporal patch by repeating the last one, like transformers does.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
    h, w = frame_size_for(len(frames), frames.shape[1], frames.shape[2], vp)
    pixels = torch.from_numpy(np.ascontiguousarray(_resize_frames(frames, h, w))).permute(0, 3, 1, 2).long()
    # One gather from a per-channel table of the 256 possible values, each computed with transformers' own
    # arithmetic (float64 rescale, cast to float32, then (x - mean) / std): bit-identical and ~10x faster.
    x = _normalize_table(vp.image_mean, vp.image_std).gather(1, pixels.transpose(0, 1).reshape(3, -1)).view(3, *pixels.shape[:1],
                                                                                 *pixels.shape[2:])
    x = x.transpose(0, 1)
    tp, p, m = vp.temporal_patch_size, vp.patch_size, vp.merge_size
    if pad := -x.shape[0] % tp:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
    gt, gh, gw = x.shape[0] // tp, h // p, w // p
    x = x.view(gt, tp, 3, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, 3 * tp * p * p).contiguous(), torch.tensor([[gt, gh, gw]])


def seconds_per_grid(timestamps: Sequence[float], temporal_patch_size: int = 2) -> float:
    """Seconds spanned by one temporal patch, from the timestamps actually sampled (mean frame interval)."""
    ts = [float(t) for t in timestamps]
    if len(ts) < 2:
        return float(temporal_patch_size)  # a single frame carries no timing; 1 s per frame by convention
    interval = (ts[-1] - ts[0]) / (len(ts) - 1)
    if not np.isfinite(interval) or interval <= 0:
        raise ValueError(f"frame timestamps must increase, got {ts[:4]}...")
    return temporal_patch_size * interval


TIMESTAMP_MODES = ("native", "text")
DEFAULT_TIMESTAMPS = "native"
LEGACY_TIMESTAMPS = {"rope": "native"}
"""Exports written before issue 22 name Qwen2.5-VL's native timing `rope`."""
TIMESTAMPS_KEY = "vtg_timestamps"  # saved in tokenizer_config.json, so an export says how it was trained


def _export_choice(tokenizer, key: str, requested: str | None, choices: tuple[str, ...], default: str,
                   what: str) -> str:
    """A prompt-format choice: the caller's, else the one the tokenizer was exported with, else `default`."""
    value = requested or getattr(tokenizer, "init_kwargs", {}).get(key) or default
    value = LEGACY_TIMESTAMPS.get(value, value) if key == TIMESTAMPS_KEY else value
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, got {value!r}")
    return value


def timestamp_mode(tokenizer, requested: str | None = None) -> str:
    """`native`: the family's own timing (Qwen2.5-VL: rope; Qwen3-VL/3.5: text); `text`: text for every family."""
    return _export_choice(tokenizer, TIMESTAMPS_KEY, requested, TIMESTAMP_MODES, DEFAULT_TIMESTAMPS, "timestamps")


def patch_times(timestamps: Sequence[float], temporal_patch_size: int) -> list[float]:
    """The time of each temporal patch: the mean of its first and last frame time, the last frame repeated to
    fill the last patch (`Qwen3VLProcessor._calculate_timestamps` over `frames_indices / fps`)."""
    if not timestamps:
        raise ValueError("a video without frame timestamps has no time to give the model")
    ts = [float(t) for t in timestamps]
    ts += [ts[-1]] * (-len(ts) % temporal_patch_size)
    return [(ts[i] + ts[i + temporal_patch_size - 1]) / 2 for i in range(0, len(ts), temporal_patch_size)]


def patch_starts(timestamps: Sequence[float], temporal_patch_size: int) -> list[float]:
    """The time each temporal patch starts: its first frame's (Qwen2.5-VL's `get_rope_index` places patch g at
    `g x second_per_grid_t`, its first frame's time on a clip sampled from its first frame; here at the frames' own
    presentation times, from the answer's origin: `vtg.model.rope_time`)."""
    if not timestamps:
        raise ValueError("a video without frame timestamps has no time to give the model")
    return [float(t) for t in list(timestamps)[::temporal_patch_size]]


def time_text(t: float) -> str:
    """How a time is written before a temporal patch: Qwen3-VL's `<{t:.1f} seconds>`."""
    return f"<{t:.1f} seconds>"


def video_block(tokens: tuple[str, str, str], grid: torch.Tensor, timestamps: Sequence[float],
                 vision: VisionParams, mode: str) -> tuple[str, torch.Tensor, int]:
    """The text that replaces the template's single video placeholder, the grid rows, and #rope groups.

    Rope timing (Qwen2.5-VL `native`): one video block, time only in the 3-D rope positions. Text timing
    (Qwen3-VL/3.5 always, Qwen2.5-VL with `text`): each temporal patch preceded by its time (`time_text`), as
    Qwen3-VL's processor writes it; Qwen3-VL keeps one grid row (its rope splits it per patch), Qwen2.5-VL gets
    one row per patch (each block is a video of its own to its rope).
    """
    start, video_token, end = tokens
    gt, gh, gw = grid[0].tolist()
    per_group = gh * gw // vision.merge_size ** 2
    family = vision.model_family
    if family.time_encoding == "mrope" and mode == "native":
        return f"{start}{video_token * (gt * per_group)}{end}", grid, 1
    times = patch_times(timestamps, vision.temporal_patch_size)
    text = "".join(f"{time_text(times[g])}{start}{video_token * per_group}{end}" for g in range(gt))
    if family.time_encoding == "mrope":
        return text, torch.tensor([[1, gh, gw]] * gt), gt
    return text, grid, 1


QUERY_POSITIONS = ("before", "after")
QUERY_POSITION_KEY = "vtg_query_position"  # saved in tokenizer_config.json like TIMESTAMPS_KEY


def query_position(tokenizer, requested: str | None = None) -> str:
    """`before`/`after` the video; exports without the key were trained with Qwen's order (`after`)."""
    return _export_choice(tokenizer, QUERY_POSITION_KEY, requested, QUERY_POSITIONS, "after", "query position")


def build_messages(query: str, position: str = "after") -> list[dict]:
    video, text = {"type": "video"}, {"type": "text", "text": query}
    return [{"role": "user", "content": [text, video] if position == "before" else [video, text]}]


QUERY_SLOT = "\ue000"
"""A private-use character the chat template renders where the query goes (`encode_prompt` cuts there)."""


def vision_tokens(tokenizer) -> tuple[str, str, str]:
    """(vision start, video pad, vision end) of the tokenizer, the default family's names when it names none."""
    start, video, end = DEFAULT.vision_tokens
    return (getattr(tokenizer, "vision_start_token", None) or start,
            getattr(tokenizer, "video_token", None) or video,
            getattr(tokenizer, "vision_end_token", None) or end)


def chat_prompt(tokenizer, messages: list[dict]) -> str:
    """The generation prompt text of `messages` under the tokenizer's chat template, answer only: a template with a
    thinking switch (Qwen3.5's) gets `enable_thinking=False`, its empty think block (the grounding recipes train and
    score the answer alone); templates without the switch ignore it."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)


def encode_prompt(tokenizer, query: str, block: str, position: str = "after",
                  system_prompt: str | None = None) -> list[int]:
    """Token ids of the generation prompt: the chat template, `block` (the video block) in place of its video
    placeholder, and the query tokenized as plain text, so that a special token written in user text
    (`<|im_end|>`, `<|video_pad|>`) stays text and can never act as a control token (docs/faults.md). The
    template's parts around the query are tokenized whole; the query sits between special tokens or after a
    newline in the Qwen templates, so for a query without such text the ids equal whole-prompt tokenization."""
    messages = build_messages(QUERY_SLOT, position)
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    prompt = chat_prompt(tokenizer, messages)
    start, video_token, end = vision_tokens(tokenizer)
    placeholder = f"{start}{video_token}{end}"
    if prompt.count(video_token) != 1 or placeholder not in prompt or prompt.count(QUERY_SLOT) != 1:
        raise ValueError(f"chat template must render exactly one {placeholder} for a video and the query once, got "
                         f"{prompt.count(video_token)} {video_token} and {prompt.count(QUERY_SLOT)} queries")
    before, _, after = prompt.replace(placeholder, block).partition(QUERY_SLOT)

    def ids(text: str, **kw) -> list[int]:
        return tokenizer(text, add_special_tokens=False, **kw)["input_ids"] if text else []

    return ids(before) + query_ids(tokenizer, query) + ids(after)


def video_grid(num_frames: int, height: int, width: int, vision: VisionParams) -> torch.Tensor:
    """`video_grid_thw` ([1, 3]) that `patchify_video` gives `num_frames` frames of height x width, without pixels."""
    h, w = frame_size_for(num_frames, height, width, vision)
    return torch.tensor([[-(-num_frames // vision.temporal_patch_size), h // vision.patch_size, w // vision.patch_size]])


def example_ids(tokenizer, grid: torch.Tensor, timestamps: Sequence[float], query: str, answer: str | None,
                vision: VisionParams, timestamps_mode: str | None = None
                ) -> tuple[list[int], list[int], torch.Tensor, int]:
    """An example's token ids without its pixels: (prompt ids, answer ids + eos, grid rows, rope groups). The one
    home of the text side of `encode_example`, so the loader counts an example's tokens exactly before decoding."""
    block, grid_rows, groups = video_block(vision_tokens(tokenizer), grid, timestamps, vision,
                                           timestamp_mode(tokenizer, timestamps_mode))
    prompt_ids = encode_prompt(tokenizer, query, block, query_position(tokenizer))
    answer_ids: list[int] = []
    if answer is not None:
        answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return prompt_ids, answer_ids, grid_rows, groups


def encode_example(
    tokenizer,
    frames: np.ndarray,
    timestamps: Sequence[float],
    query: str,
    answer: str | None,
    *,
    vision: VisionParams = QWEN25VL_FACTS,
    max_length: int | None = None,
    key: str = "",
    timestamps_mode: str | None = None,
) -> dict:
    """One example's model inputs (1-D tensors, no batch dim). `answer=None` -> a generation prompt.

    `answer` is the target text, which callers build with `vtg.answer.format_answer` (see `answer_text`).
    Labels are -100 everywhere except the answer tokens and the closing `<|im_end|>`. `max_length` truncation
    that would cut the answer raises ValueError (the sanity checks turn it into a clear error).
    `timestamps_mode` (`native` or `text`, see `video_block`) defaults to what the tokenizer was exported with.
    Qwen2.5-VL gets `second_per_grid_ts`, and under its native timing `position_ids` (3, L): each temporal patch's
    rope id at its frames' mean time from the answer's origin (`vtg.model.rope_time`); text-timed families are told
    the time in the prompt and take neither.
    """
    if len(timestamps) != len(frames):
        raise ValueError(f"{key}: {len(frames)} frames but {len(timestamps)} timestamps")
    pixels, grid = patchify_video(frames, vision)
    n_video_tokens = int(grid.prod()) // (vision.merge_size ** 2)
    prompt_ids, answer_ids, grid_rows, groups = example_ids(tokenizer, grid, timestamps, query, answer, vision,
                                                            timestamps_mode)
    video_token = vision_tokens(tokenizer)[1]
    ids = prompt_ids + answer_ids
    if max_length is not None and len(ids) > max_length:
        raise ValueError(f"{key}: example is {len(ids)} tokens > max_length {max_length}; the answer would be "
                         "truncated (raise train.max_seq_len or use fewer/smaller frames)")
    video_id = tokenizer.convert_tokens_to_ids(video_token)
    input_ids = torch.tensor(ids, dtype=torch.long)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    if answer_ids:
        labels[len(prompt_ids):] = input_ids[len(prompt_ids):]
    mm = torch.where(input_ids == video_id, MM_VIDEO, MM_TEXT).to(torch.int32)
    if int((mm == MM_VIDEO).sum()) != n_video_tokens:
        raise ValueError(f"{key}: tokenizer split the video placeholder ({int((mm == MM_VIDEO).sum())} video "
                         f"tokens, expected {n_video_tokens})")
    out = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": labels,
        "mm_token_type_ids": mm,
        "pixel_values_videos": pixels,
        "video_grid_thw": grid_rows,
        "key": key,
    }
    if "second_per_grid_ts" in vision.model_family.model_inputs:
        out["second_per_grid_ts"] = torch.tensor([seconds_per_grid(timestamps, vision.temporal_patch_size)] * groups)
        if timestamp_mode(tokenizer, timestamps_mode) == "native":
            out["position_ids"] = rope_positions(mm, grid_rows, vision.merge_size,
                                                 [patch_starts(timestamps, vision.temporal_patch_size)],
                                                 vision.tokens_per_second)
    return out


def answer_text(windows: Sequence[Sequence[float]]) -> str:
    """Training target for a query: the first ground-truth window in the shared answer format."""
    start, end = windows[0]
    return format_answer(float(start), float(end))


def collate(examples: list[dict], pad_token_id: int, padding_side: str = "right",
            share_videos: bool = False) -> dict:
    """Pad token tensors to the longest example; concatenate the video tensors (they are flat over patches).

    `share_videos`: examples that hold the same video (`vtg.model.shared_vision.distinct_videos`) put its pixels
    in the batch once; `video_grid_thw` stays per row (the rope reads it) and `batch["video_share"]` maps the rows
    onto the distinct videos, for `shared_video_features` around the model call (one vision pass per video)."""
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    length = max(len(e["input_ids"]) for e in examples)
    pad_values = {"input_ids": pad_token_id, "attention_mask": 0, "labels": IGNORE_INDEX, "mm_token_type_ids": 0}
    batch: dict = {}
    for name, value in pad_values.items():
        rows = []
        for e in examples:
            t = e[name]
            pad = t.new_full((length - len(t),), value)
            rows.append(torch.cat([t, pad]) if padding_side == "right" else torch.cat([pad, t]))
        batch[name] = torch.stack(rows)
    if any("position_ids" in e for e in examples):  # Qwen2.5-VL's native timing (`vtg.model.rope_time`)
        rows = []
        for e in examples:
            t = e["position_ids"]
            pad = t.new_zeros((3, length - t.shape[1]))
            rows.append(torch.cat([t, pad], 1) if padding_side == "right" else torch.cat([pad, t], 1))
        batch["position_ids"] = torch.stack(rows, dim=1)
    with_pixels = examples
    if share_videos:
        batch["video_share"], firsts = video_share(examples)
        with_pixels = [examples[i] for i in firsts]
    batch["pixel_values_videos"] = torch.cat([e["pixel_values_videos"] for e in with_pixels])
    batch["video_grid_thw"] = torch.cat([e["video_grid_thw"] for e in examples])
    if all("second_per_grid_ts" in e for e in examples):
        batch["second_per_grid_ts"] = torch.cat([e["second_per_grid_ts"] for e in examples])
    batch["keys"] = [e.get("key", "") for e in examples]
    return batch


MODEL_INPUTS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "pixel_values_videos",
                "video_grid_thw", "second_per_grid_ts", "position_ids")


def model_inputs(batch: dict, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> dict:
    """The tensors the model's forward takes, moved to `device` (pixels cast to `dtype` when given)."""
    out = {k: batch[k].to(device) for k in MODEL_INPUTS if k in batch}
    if dtype is not None and "pixel_values_videos" in out:
        out["pixel_values_videos"] = out["pixel_values_videos"].to(dtype)
    return out
