"""General-task suites: what forgetting is measured with (seed 000: model quality "eval IoU, forgetting").

Grounding SFT and RL can erase what a model could do before; a retention suite asks the base model and each
checkpoint the same general questions and reports, per task, checkpoint accuracy / base accuracy.

The format, one JSON object per line (`read_suite`):

    {"id": "ev12-shape", "task": "shape",                       # unique id; tasks are reported separately
     "video": "../videos/v0007.mp4", "start_s": 3.0, "end_s": 7.5,   # a clip of a video (path relative to
                                                                 # the suite file's folder, or absolute) ...
     "image": null,                                              # ... or one image instead of a video
     "question": "What shape is the red object?",
     "choices": ["circle", "square", "triangle"],                # multiple choice; [] for a short answer
     "answer": "circle"}

Scoring is exact: the generated text, lower-cased with surrounding spaces and final punctuation removed, must
equal the answer normalised the same way (`is_correct`). A multiple-choice question lists its choices in the
prompt (`prompt_text`). Frames: `num_frames` spread uniformly over [start_s, end_s) of the video (distinct frames
only), stored like the shards' frames (about `frame_size`^2 pixels, the aspect ratio kept: `vtg.shards`), so the
model sees them as it sees grounding windows.

The embedded default's suites come from the synthetic corpus (`corpus.general`): the tiny base model is first
taught them (`training.teach`) so that there is something to forget.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from vtg.errors import VTGError
from vtg.frames import clip_frames, clips_frames, resize_stored


class GeneralItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    task: str
    question: str
    answer: str
    choices: tuple[str, ...] = ()
    video: str | None = None
    start_s: float = 0.0
    end_s: float | None = None
    image: str | None = None

    @model_validator(mode="after")
    def _media(self) -> GeneralItem:
        if (self.video is None) == (self.image is None):
            raise ValueError("give exactly one of `video` and `image`")
        if self.choices and normalize(self.answer) not in {normalize(c) for c in self.choices}:
            raise ValueError(f"answer {self.answer!r} is not one of the choices {list(self.choices)}")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"clip [{self.start_s}, {self.end_s}] is empty")
        return self


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(".!?;:,").strip()


def is_correct(generated: str, item: GeneralItem) -> bool:
    return normalize(generated) == normalize(item.answer)


def prompt_text(item: GeneralItem) -> str:
    """The question as the model gets it (the choices listed for a multiple-choice item)."""
    if not item.choices:
        return item.question
    return f"{item.question} Answer with one of: {', '.join(item.choices)}."


def answer_text(item: GeneralItem) -> str:
    """The target text taught for an item (`training.teach`)."""
    return item.answer


def read_suite(path: str | Path) -> list[GeneralItem]:
    """The items of a suite file, media paths made absolute; a bad line is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise VTGError(f"{path}: no general-task suite there")
    items, seen = [], set()
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            for key in ("video", "image"):
                if data.get(key):
                    data[key] = str((path.parent / data[key]).resolve())
            item = GeneralItem.model_validate(data)
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'item'}: {err['msg']}" for err in e.errors())
            raise VTGError(f"{path}:{no}: not a general-task item ({why})") from None
        except ValueError as e:
            raise VTGError(f"{path}:{no}: not a general-task item ({str(e).splitlines()[0]})") from None
        if item.id in seen:
            raise VTGError(f"{path}:{no}: id {item.id!r} appears twice")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise VTGError(f"{path}: the suite holds no item")
    return items


def load_frames(item: GeneralItem, num_frames: int, frame_size: int) -> tuple[np.ndarray, list[float]]:
    """(uint8 RGB frames [T, H, W, 3], seconds from the clip's start) of an item; an unreadable file is an error."""
    import cv2

    if item.image:
        bgr = cv2.imread(item.image)
        if bgr is None:
            raise VTGError(f"{item.id}: cannot read the image {item.image}")
        return resize_stored(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), frame_size)[None], [0.0]
    return clip_frames(item.video, item.start_s, item.end_s, num_frames, frame_size)


CLIPS_VERSION = 1
"""Bump when `clips_frames` would give other frames for the same files (invalidates `suite_frames`' cache)."""
CACHE_ENV = "VTG_SUITE_FRAMES_CACHE"
"""Where decoded suites are kept (default `vtg/.cache/suite_frames`, beside the tiny models; safe to delete: a
missing entry is decoded again). The test suite points it at its own temp folder."""


def _clips_key(clips: list[tuple], num_frames: int, frame_size: int) -> str:
    """The cache key of decoding `clips` [(video, start_s, end_s)]: every file's identity (path, size, mtime) and
    span, and the frame settings."""
    files = {}
    for v, _, _ in clips:
        if v not in files:
            try:
                files[v] = os.stat(v)
            except OSError as e:
                raise VTGError(f"{v}: cannot read the video ({e.strerror}); a general-task item names it") from None
    spec = [CLIPS_VERSION, num_frames, frame_size,
            [[v, files[v].st_size, files[v].st_mtime_ns, s, e] for v, s, e in clips]]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:24]


def _decoded_clips(clips: list[tuple], num_frames: int, frame_size: int) -> list[tuple[np.ndarray, list[float]]]:
    """`clips_frames` of `clips` [(video, start_s, end_s)], in their order: read from the on-disk cache
    (`CACHE_ENV`, keyed by the files' identities and the settings) when a process decoded them
    before, else decoded (one `clips_frames` call per video) and cached for the next process. Every evaluation,
    the teaching and the training mix of a run read the same suite: decoded once, not once per process."""
    from vtg.model.tiny import build_once, default_cache_dir

    key = _clips_key(clips, num_frames, frame_size)
    out = Path(os.environ.get(CACHE_ENV) or default_cache_dir().parent / "suite_frames") / key

    def decode_into(tmp: Path) -> None:
        by_video: dict[str, list[tuple[float, float | None]]] = {}
        for video, start, end in clips:
            by_video.setdefault(video, []).append((start, end))
        got = {(video, *span): clip for video, spans in by_video.items()
               for span, clip in zip(spans, clips_frames(video, spans, num_frames, frame_size))}
        decoded = [got[c] for c in clips]
        with open(tmp / "frames.u8", "wb") as f:
            f.writelines(np.ascontiguousarray(frames, np.uint8).tobytes() for frames, _ in decoded)
        (tmp / "index.json").write_text(json.dumps([[list(fr.shape), t] for fr, t in decoded]))
        (tmp / "DONE").write_text(json.dumps({"key": key}))

    build_once(out, "DONE", {"key": key}, decode_into)
    flat = np.fromfile(out / "frames.u8", np.uint8)
    result, at = [], 0
    for shape, times in json.loads((out / "index.json").read_text()):
        n = int(np.prod(shape))
        result.append((flat[at:at + n].reshape(shape), times))
        at += n
    return result


def suite_frames(items: list[GeneralItem], num_frames: int,
                 frame_size: int) -> list[tuple[np.ndarray, list[float]]]:
    """`load_frames` of every item, aligned with `items`: each video read in one `clips_frames` call for all its
    items' clips (two passes over the file, not two per item) and kept in an on-disk cache for the next process
    (`_decoded_clips`), each image read once. The one loader of a whole suite (teaching, the training mix,
    retention)."""
    clips = list(dict.fromkeys((item.video, item.start_s, item.end_s) for item in items if item.video))
    decoded = dict(zip(clips, _decoded_clips(clips, num_frames, frame_size))) if clips else {}
    images: dict[str, tuple[np.ndarray, list[float]]] = {}
    out = []
    for item in items:
        if item.video:
            out.append(decoded[(item.video, item.start_s, item.end_s)])
        else:
            if item.image not in images:
                images[item.image] = load_frames(item, num_frames, frame_size)
            out.append(images[item.image])
    return out
