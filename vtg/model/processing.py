"""Turn (frames, timestamps, query, answer) into a Qwen VLM's inputs, without transformers' video processor.

transformers' video processor needs torchvision, which cannot live beside the CPU torch here (docs/environment.md), so
the patchify step is ours: resize to a multiple of patch x merge within the pixel bounds (PIL bicubic, as
`Qwen2VLImageProcessor` does), rescale, normalise with the mean/std, and the same (t, h, w) -> (merged patch)
reshape. It matches `Qwen2VLImageProcessor` exactly (tests/training/test_train_processing.py, test_family_parity.py).

The processor facts (patch, merge and temporal patch sizes, pixel bounds, mean/std) are the checkpoint's own:
`VisionParams.from_model` reads the `preprocessor_config.json` next to the weights the model was loaded from
(a checkpoint without one is an error, never a silent default), and every export keeps a copy
(`save_processor_config`), so training, RL, evaluation and serving all patchify the way the model was trained.

Timing reaches the model through `second_per_grid_ts` = seconds spanned by one temporal patch, computed from the
frame timestamps actually sampled (never a configured fps). `mm_token_type_ids` marks the video tokens (2) so
that transformers 5 builds 3-D rope positions (without it the model silently falls back to 1-D positions).

The family (`vtg.model.families`) decides the rest: Qwen2.5-VL's pixel bounds hold per frame and its time is
the rope (`second_per_grid_ts`); Qwen3-VL's and Qwen3.5's bounds hold for the whole clip (their
`video_preprocessor_config.json`) and their time is text, `<t.t seconds>` before each temporal patch, t the mean
of the patch's first and last frame time (`Qwen3VLProcessor._calculate_timestamps`). Parity with transformers'
own functions: tests/training/test_family_parity.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vtg.answer import format_answer
from vtg.errors import VTGError
from vtg.model.families import CLIP_MEAN as _CLIP_MEAN
from vtg.model.families import CLIP_STD as _CLIP_STD
from vtg.model.families import DEFAULT, QWEN2_5_VL, Family, family_named, family_of
from vtg.model.geometry import Geometry, resized_size
from vtg.model.tokens import query_ids

CLIP_MEAN = tuple(_CLIP_MEAN)
CLIP_STD = tuple(_CLIP_STD)
MM_TEXT, MM_IMAGE, MM_VIDEO = 0, 1, 2
IGNORE_INDEX = -100
PROCESSOR_CONFIG = "preprocessor_config.json"
VIDEO_PROCESSOR_CONFIG = "video_preprocessor_config.json"
QWEN25VL_PROCESSOR = QWEN2_5_VL.processor
"""Qwen/Qwen2.5-VL-{3B,7B}-Instruct's `preprocessor_config.json` on the hub (its home: `vtg.model.families`): what
the tiny and shape-true builders write, so that their exports carry the processor facts a real checkpoint does."""


@dataclass(frozen=True)
class VisionParams:
    """The processor facts: the vision tower's patch geometry, the pixel bounds of the resize, and the mean/std.
    Defaults: Qwen2.5-VL's (`QWEN25VL_PROCESSOR`); a loaded model's come from its checkpoint (`from_model`)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 12845056
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    pixel_scope: str = "frame"
    """What min/max pixels bound: one `frame` (Qwen2.5-VL's image processor) or the whole `video` (t x h x w,
    Qwen3-VL's video processor)."""
    family: str = DEFAULT.name
    """The model family (`vtg.model.families`): how time reaches the model."""

    @property
    def model_family(self) -> Family:
        return family_named(self.family)

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.patch_size, self.merge_size, self.temporal_patch_size, self.min_pixels,
                        self.max_pixels, self.pixel_scope)

    @classmethod
    def for_family(cls, family: Family, **geometry) -> VisionParams:
        """The family's published facts (its video processor's where it has one), `geometry` overriding."""
        published = family.video_processor or family.processor
        vp = cls.from_processor_config(published, family.processor_source,
                                       "video" if family.video_processor else "frame")
        return dataclasses.replace(vp, family=family.name, **geometry)

    @classmethod
    def from_model_config(cls, config) -> VisionParams:
        """The patch geometry of a model config, the other facts its family's published ones: for models built
        in memory (tests, the GPU smoke test); a loaded checkpoint's facts come from `from_model`."""
        v = config.vision_config
        return cls.for_family(family_of(config), patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                              temporal_patch_size=v.temporal_patch_size)

    @classmethod
    def from_processor_config(cls, data: dict, where: str = "preprocessor_config.json",
                              pixel_scope: str = "frame") -> VisionParams:
        """From a `preprocessor_config.json` (its keys: patch_size, merge_size, temporal_patch_size, image_mean,
        image_std, and min_pixels/max_pixels or, as transformers 5 writes them, size.shortest_edge/longest_edge)
        or a `video_preprocessor_config.json` (`pixel_scope="video"`: the bounds hold for t x h x w)."""
        size = data.get("size") if isinstance(data.get("size"), dict) else {}
        facts = {"patch_size": data.get("patch_size"), "merge_size": data.get("merge_size"),
                 "temporal_patch_size": data.get("temporal_patch_size"),
                 "min_pixels": data.get("min_pixels", size.get("shortest_edge")),
                 "max_pixels": data.get("max_pixels", size.get("longest_edge")),
                 "image_mean": data.get("image_mean"), "image_std": data.get("image_std")}
        missing = [k for k, v in facts.items() if v is None]
        if missing:
            raise VTGError(f"{where}: no {', '.join(missing)}: the processor facts must come from the checkpoint "
                           "(copy the base model's preprocessor_config.json next to the weights)")
        try:
            return cls(**{k: tuple(float(x) for x in v) if k.startswith("image_") else int(v)
                          for k, v in facts.items()}, pixel_scope=pixel_scope)
        except (TypeError, ValueError):
            raise VTGError(f"{where}: malformed processor facts {facts}") from None

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, config=None) -> VisionParams:
        """The facts in `<model_dir>/video_preprocessor_config.json` where the checkpoint has one (Qwen3-VL,
        Qwen3.5: bounds over the whole clip), else its `preprocessor_config.json` (a hub id: the files in the
        local Hugging Face cache), checked against `config`'s vision tower when given."""
        video = processor_config_path(model_dir, VIDEO_PROCESSOR_CONFIG)
        found = video or processor_config_path(model_dir)
        vp = (_facts_in(str(found), found.stat().st_mtime_ns, "video" if video else "frame")
              if found is not None else None)
        if vp is None:
            raise VTGError(f"{model_dir}: no {PROCESSOR_CONFIG}: the checkpoint's own processor facts (pixel bounds, "
                           "mean/std, patch sizes) are needed to build its inputs; copy the base model's "
                           f"{PROCESSOR_CONFIG} next to the weights (every export of this project writes one)")
        if config is not None:
            v = config.vision_config
            model = (v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
            if (vp.patch_size, vp.merge_size, vp.temporal_patch_size) != model:
                raise VTGError(f"{found}: patch/merge/temporal patch {vp.patch_size}/{vp.merge_size}/"
                               f"{vp.temporal_patch_size}, but the model's vision tower has {'/'.join(map(str, model))}")
            family = family_of(config)
            if family.video_processor is not None and video is None:
                raise VTGError(f"{model_dir}: no {VIDEO_PROCESSOR_CONFIG}: a {family.name} checkpoint's video pixel "
                               f"bounds are in it; copy the base model's {VIDEO_PROCESSOR_CONFIG} next to the weights")
            vp = dataclasses.replace(vp, family=family.name)
        return vp

    @classmethod
    def from_model(cls, model) -> VisionParams:
        """A loaded model's facts: the processor config beside the weights it was loaded from (for a LoRA
        model, its base's)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        return cls.from_checkpoint(getattr(config, "_name_or_path", "") or "", config)

    def to_processor_config(self) -> dict:
        """Qwen2.5-VL's `preprocessor_config.json` layout with these facts (per-frame bounds)."""
        return {**QWEN25VL_PROCESSOR, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                "patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge_size, "image_mean": list(self.image_mean), "image_std": list(self.image_std)}


def published_processor_files(family: Family, geometry: VisionParams | None = None) -> dict[str, dict]:
    """{file name: content} of the processor configs a checkpoint of `family` publishes (patch geometry from
    `geometry` when given: a tiny model's own), what the builders write beside the weights."""
    files = {PROCESSOR_CONFIG: dict(family.processor)}
    if family.video_processor is not None:
        files[VIDEO_PROCESSOR_CONFIG] = dict(family.video_processor)
    if geometry is not None:
        for data in files.values():
            data.update(patch_size=geometry.patch_size, merge_size=geometry.merge_size,
                        temporal_patch_size=geometry.temporal_patch_size)
    return files


@functools.lru_cache(maxsize=32)
def _facts_in(path: str, mtime_ns: int, pixel_scope: str = "frame") -> VisionParams:
    """A processor config file's facts, read once per file version (evaluation asks for them every batch)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise VTGError(f"{path}: unreadable ({e})") from None
    return VisionParams.from_processor_config(data, path, pixel_scope)


def processor_config_path(model_dir: str | Path, name: str = PROCESSOR_CONFIG) -> Path | None:
    """`<model_dir>/<name>`, or for a hub id its copy in the local Hugging Face cache."""
    if not str(model_dir):
        return None
    local = Path(model_dir) / name
    if local.is_file():
        return local
    if Path(model_dir).is_dir():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model_dir), name)
    except Exception:  # noqa: BLE001 - not a repo id: nothing cached under it
        return None
    return Path(cached) if isinstance(cached, str) else None


def save_processor_config(model, export_dir: str | Path) -> None:
    """Copy the model's processor configs into an export (`hf/`), so the export holds them like a hub
    checkpoint."""
    from vtg.io import write_json_atomic

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    source = getattr(base.config, "_name_or_path", "") or ""
    for name in (PROCESSOR_CONFIG, VIDEO_PROCESSOR_CONFIG):
        if (found := processor_config_path(source, name)) is not None:
            write_json_atomic(Path(export_dir) / name, json.loads(found.read_text()))
    if processor_config_path(source) is None:
        write_json_atomic(Path(export_dir) / PROCESSOR_CONFIG, VisionParams.from_model(model).to_processor_config())


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


def patchify_video(frames: np.ndarray, vp: VisionParams = VisionParams()) -> tuple[torch.Tensor, torch.Tensor]:
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
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start, video_token, end = vision_tokens(tokenizer)
    placeholder = f"{start}{video_token}{end}"
    if prompt.count(video_token) != 1 or placeholder not in prompt or prompt.count(QUERY_SLOT) != 1:
        raise ValueError(f"chat template must render exactly one {placeholder} for a video and the query once, got "
                         f"{prompt.count(video_token)} {video_token} and {prompt.count(QUERY_SLOT)} queries")
    before, _, after = prompt.replace(placeholder, block).partition(QUERY_SLOT)

    def ids(text: str, **kw) -> list[int]:
        return tokenizer(text, add_special_tokens=False, **kw)["input_ids"] if text else []

    return ids(before) + query_ids(tokenizer, query) + ids(after)


def encode_example(
    tokenizer,
    frames: np.ndarray,
    timestamps: Sequence[float],
    query: str,
    answer: str | None,
    *,
    vision: VisionParams = VisionParams(),
    max_length: int | None = None,
    key: str = "",
    timestamps_mode: str | None = None,
) -> dict:
    """One example's model inputs (1-D tensors, no batch dim). `answer=None` -> a generation prompt.

    `answer` is the target text, which callers build with `vtg.answer.format_answer` (see `answer_text`).
    Labels are -100 everywhere except the answer tokens and the closing `<|im_end|>`. `max_length` truncation
    that would cut the answer raises ValueError (the sanity checks turn it into a clear error).
    `timestamps_mode` (`native` or `text`, see `video_block`) defaults to what the tokenizer was exported with.
    Qwen2.5-VL gets `second_per_grid_ts` (its rope timing); text-timed families do not take it.
    """
    if len(timestamps) != len(frames):
        raise ValueError(f"{key}: {len(frames)} frames but {len(timestamps)} timestamps")
    pixels, grid = patchify_video(frames, vision)
    n_video_tokens = int(grid.prod()) // (vision.merge_size ** 2)
    block_tokens = vision_tokens(tokenizer)
    block, grid_rows, groups = video_block(block_tokens, grid, timestamps, vision,
                                            timestamp_mode(tokenizer, timestamps_mode))
    prompt_ids = encode_prompt(tokenizer, query, block, query_position(tokenizer))
    video_token = block_tokens[1]
    answer_ids: list[int] = []
    if answer is not None:
        answer_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
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
    return out


def answer_text(windows: Sequence[Sequence[float]]) -> str:
    """Training target for a query: the first ground-truth window in the shared answer format."""
    start, end = windows[0]
    return format_answer(float(start), float(end))


def collate(examples: list[dict], pad_token_id: int, padding_side: str = "right") -> dict:
    """Pad token tensors to the longest example; concatenate the video tensors (they are flat over patches)."""
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
    batch["pixel_values_videos"] = torch.cat([e["pixel_values_videos"] for e in examples])
    batch["video_grid_thw"] = torch.cat([e["video_grid_thw"] for e in examples])
    if all("second_per_grid_ts" in e for e in examples):
        batch["second_per_grid_ts"] = torch.cat([e["second_per_grid_ts"] for e in examples])
    batch["keys"] = [e.get("key", "") for e in examples]
    return batch


MODEL_INPUTS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "pixel_values_videos",
                "video_grid_thw", "second_per_grid_ts")


def model_inputs(batch: dict, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> dict:
    """The tensors the model's forward takes, moved to `device` (pixels cast to `dtype` when given)."""
    out = {k: batch[k].to(device) for k in MODEL_INPUTS if k in batch}
    if dtype is not None and "pixel_values_videos" in out:
        out["pixel_values_videos"] = out["pixel_values_videos"].to(dtype)
    return out
