"""Bad videos for the fault suite, written with what the venv has (OpenCV's mp4v writer; no ffmpeg binary, no
PyAV): the rest is done by editing the MP4 boxes with `struct` (rotation in the track header's display matrix,
variable frame durations in the time-to-sample table, the index moved in front of the media data)."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import cv2
import numpy as np

CONTAINERS = {"moov", "trak", "mdia", "minf", "stbl", "edts", "dinf", "udta"}


def write_video(path: Path, n_frames: int, fps: float = 8.0, size: tuple[int, int] = (96, 96),
                seed: int = 0) -> None:
    """`n_frames` frames of w x h = `size`: two textured scenes (a cut half-way) with a moving red square,
    colours and stripe periods from `seed`. n_frames may be 0 (a container with no sample) or 1."""
    w, h = size
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    xx = np.mgrid[0:h, 0:w][1]
    for t in range(n_frames):
        rng = np.random.default_rng(seed * 10 + (2 * t >= n_frames))
        base, period = rng.integers(40, 200, 3), int(rng.integers(6, 20)) * max(1, min(w, h) // 96)
        img = (base[None, None, :] * (0.6 + 0.4 * ((xx // period) % 2)[..., None])).astype(np.uint8)
        side = max(16, min(w, h) // 6)
        x = (5 + 2 * t * max(1, side // 16)) % (w - side)
        img[side:2 * side, x:x + side] = (0, 0, 255)
        out.write(img)
    out.release()


# ---- MP4 boxes -------------------------------------------------------------------------------------------------

def parse(data: bytes) -> list[list]:
    """[[type, payload bytes | child boxes], ...] (32-bit sizes only: what OpenCV's muxer writes here)."""
    boxes, off = [], 0
    while off < len(data):
        size, typ = struct.unpack(">I4s", data[off:off + 8])
        assert size >= 8, "64-bit or to-the-end box sizes are not handled"
        name, body = typ.decode("latin1"), data[off + 8:off + size]
        boxes.append([name, parse(body) if name in CONTAINERS else body])
        off += size
    return boxes


def build(boxes: list[list]) -> bytes:
    out = b""
    for name, body in boxes:
        payload = body if isinstance(body, bytes) else build(body)
        out += struct.pack(">I4s", 8 + len(payload), name.encode("latin1")) + payload
    return out


def find(boxes: list[list], name: str):
    for box in boxes:
        if box[0] == name:
            yield box
        if not isinstance(box[1], bytes):
            yield from find(box[1], name)


def _edit(path: Path, fn) -> None:
    tree = parse(path.read_bytes())
    fn(tree)
    path.write_bytes(build(tree))


def set_rotation(path: Path, degrees: int) -> None:
    """Rotation metadata (what phones write for portrait video): the track header's display matrix."""
    def edit(tree):
        c, s = round(math.cos(math.radians(degrees))), round(math.sin(math.radians(degrees)))
        for box in find(tree, "tkhd"):
            body = bytearray(box[1])
            off = 52 if body[0] == 1 else 40  # version 1 has 64-bit times
            body[off:off + 36] = struct.pack(">9i", c << 16, s << 16, 0, -s << 16, c << 16, 0, 0, 0, 1 << 30)
            box[1] = bytes(body)
    _edit(path, edit)


def make_variable_frame_rate(path: Path) -> tuple[float, float]:
    """First half of the frames at twice the rate, second half at 2/3 of it (same total duration): two entries
    in the time-to-sample table. Returns the two rates (frames/s)."""
    rates = []

    def edit(tree):
        [mdhd] = find(tree, "mdhd")
        timescale = struct.unpack(">I", mdhd[1][12:16])[0]
        for box in find(tree, "stts"):
            (n, d), = [struct.unpack(">II", box[1][8:16])]
            assert n % 2 == 0 and d % 2 == 0, (n, d)
            entries = [(n // 2, d // 2), (n // 2, d + d // 2)]
            rates.extend(timescale / e[1] for e in entries)
            box[1] = box[1][:4] + struct.pack(">I", len(entries)) + b"".join(struct.pack(">II", *e) for e in entries)
    _edit(path, edit)
    return rates[0], rates[1]


def move_index_first(path: Path) -> None:
    """`moov` in front of `mdat` ("fast start", as streamed files are): chunk offsets shift by moov's size."""
    tree = parse(path.read_bytes())
    moov = next(b for b in tree if b[0] == "moov")
    shift = len(build([moov]))
    for box in find([moov], "stco"):
        n = struct.unpack(">I", box[1][4:8])[0]
        offsets = struct.unpack(f">{n}I", box[1][8:8 + 4 * n])
        box[1] = box[1][:8] + struct.pack(f">{n}I", *(o + shift for o in offsets))
    rest = [b for b in tree if b[0] != "moov"]
    path.write_bytes(build([rest[0], moov, *rest[1:]]))  # after ftyp


def truncate(path: Path, fraction: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * fraction)])
