"""Pixels: render a planned video frame by frame and write it (mp4v in .mp4, deterministic byte for byte).

OpenCV's FFmpeg mp4v writer was measured to produce identical bytes for identical frames across processes
and runs (it embeds only the libavformat version, no timestamp), so the corpus is reproducible per OpenCV build.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from corpus.plan import COLORS

FOURCC = "mp4v"
NOT_VIDEO_TEXT = "This is not a video. It is a text file that happens to have a video extension.\n"


def _texture(t: dict, h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    p = max(2, round(t["period"] * h / 112))
    mask = {
        "stripes_h": (yy // p) % 2,
        "stripes_v": (xx // p) % 2,
        "checker": ((yy // p) + (xx // p)) % 2,
        "diagonal": ((xx + yy) // p) % 2,
        "gradient": xx / max(1, w - 1),
        "dots": ((yy % p) < p / 3) & ((xx % p) < p / 3),
    }[t["pattern"]].astype(np.float32)[..., None]
    c1 = np.array(t["level"], np.float32) + np.array(t["tint"], np.float32)
    c2 = c1 + t["contrast"] + np.array(t["tint2"], np.float32)
    return np.clip(c1 * (1 - mask) + c2 * mask, 0, 255).astype(np.uint8)


def _text_frame(kind: str, offset: int, h: int, w: int) -> np.ndarray:
    img = np.full((h, w, 3), 12, np.uint8)
    scale = h / 112
    if kind == "title":
        cv2.putText(img, "TITLE", (int(14 * scale), int(60 * scale)), cv2.FONT_HERSHEY_SIMPLEX, 0.9 * scale,
                    (235, 235, 235), max(1, int(2 * scale)), cv2.LINE_AA)
        cv2.line(img, (int(14 * scale), int(72 * scale)), (int(98 * scale), int(72 * scale)), (200, 200, 200), 1)
    else:  # credits scroll up
        for k in range(8):
            y = int(h + 18 * scale * k - offset * 4 * scale)
            if 0 < y < h + 10:
                cv2.putText(img, ["CREDITS", "director", "camera", "sound", "cast", "music", "thanks", "end"][k],
                            (int(16 * scale), y), cv2.FONT_HERSHEY_SIMPLEX, 0.45 * scale, (225, 225, 225), 1,
                            cv2.LINE_AA)
    return img


def _draw(img: np.ndarray, obj: dict, frame: int) -> None:
    h, w = img.shape[:2]
    m = obj["motion"]
    span = max(1, obj["end_frame"] - obj["start_frame"] - 1)
    t = (frame - obj["start_frame"]) / span
    cx, cy = (m["x0"] + (m["x1"] - m["x0"]) * t) * w, (m["y0"] + (m["y1"] - m["y0"]) * t) * h
    r = m["radius"] * min(h, w)
    color = COLORS[obj["color"]]
    if obj["shape"] == "circle":
        cv2.circle(img, (round(cx), round(cy)), round(r), color, -1, cv2.LINE_AA)
    elif obj["shape"] == "square":
        cv2.rectangle(img, (int(cx - r), int(cy - r)), (int(cx + r), int(cy + r)), color, -1)
    else:
        pts = np.array([[cx, cy - r], [cx - r, cy + r * 0.8], [cx + r, cy + r * 0.8]], np.int32)
        cv2.fillPoly(img, [pts], color, cv2.LINE_AA)


def render_frames(plan: dict) -> list[np.ndarray]:
    """All frames (BGR uint8) of a clean rendering of `plan` at its own width/height."""
    h, w, n = plan["height"], plan["width"], plan["n_frames"]
    scene_of = np.zeros(n, np.int32)
    backgrounds = []
    for k, s in enumerate(plan["scenes"]):
        scene_of[s["start_frame"]:s["end_frame"]] = k
        backgrounds.append(_texture(s["texture"], h, w) if s["kind"] == "texture" else None)
    blend: dict[int, tuple[int, float]] = {}  # frame -> (incoming scene, its weight)
    for a, b in plan["gradual_transitions"]:
        k_in = next(k for k, s in enumerate(plan["scenes"]) if a < s["start_frame"] <= b + 1)
        for f in range(a, b + 1):
            blend[f] = (k_in, (f - a + 1) / (b - a + 2))
    objects = [e for e in plan["events"] if "motion" in e and e["kind"] != "duplicate_query"] + plan["distractors"]

    def background(k: int, f: int) -> np.ndarray:
        sc = plan["scenes"][k]
        if backgrounds[k] is None:
            return _text_frame(sc["kind"], f - sc["start_frame"], h, w)
        return backgrounds[k].copy()

    frames = []
    for f in range(n):
        if f in blend:
            k_in, alpha = blend[f]
            img = cv2.addWeighted(background(k_in - 1, f), 1 - alpha, background(k_in, f), alpha, 0)
        else:
            img = background(int(scene_of[f]), f)
        for obj in objects:
            if obj["start_frame"] <= f < obj["end_frame"]:
                _draw(img, obj, f)
        frames.append(img)
    return frames


def write_video(path: Path, frames: list[np.ndarray], fps: float) -> None:
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*FOURCC), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV could not open a {FOURCC} writer for {path}")
    for img in frames:
        writer.write(img)
    writer.release()


def apply_defect(frames: list[np.ndarray], defect: dict) -> list[np.ndarray]:
    kind = defect["kind"]
    if kind == "blurred":
        return [cv2.GaussianBlur(f, (0, 0), defect["sigma"]) for f in frames]
    if kind == "dark":
        return [cv2.convertScaleAbs(f, alpha=defect["gain"]) for f in frames]
    if kind == "low_res":
        return [cv2.resize(f, (defect["width"], defect["height"]), interpolation=cv2.INTER_AREA) for f in frames]
    if kind == "near_duplicate":
        t = defect["transform"]
        out = []
        for f in frames[t["trim_start_frames"]:]:
            f = cv2.resize(f, (t["width"], t["height"]), interpolation=cv2.INTER_LINEAR)
            f = cv2.convertScaleAbs(f, alpha=1.0, beta=t["brightness"]) if t["brightness"] > 0 else \
                cv2.subtract(f, np.full_like(f, -t["brightness"]))
            _ok, buf = cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, t["jpeg_quality"]])
            out.append(cv2.imdecode(buf, cv2.IMREAD_COLOR))
        return out
    return frames


def render_video(plan: dict, path: Path) -> dict:
    """Render + write one planned video (defects included); returns what was actually written."""
    kind = plan["defect"]["kind"]
    if kind == "zero_byte":
        path.write_bytes(b"")
        return {"bytes": 0}
    if kind == "not_video":
        path.write_text(NOT_VIDEO_TEXT)
        return {"bytes": len(NOT_VIDEO_TEXT)}
    source = plan.get("source_plan", plan)
    if kind == "low_res":
        source = {**plan, "width": plan["defect"]["source_width"], "height": plan["defect"]["source_height"]}
    frames = apply_defect(render_frames(source), plan["defect"])
    write_video(path, frames, plan["fps"])
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * plan["defect"]["keep_fraction"])])
    return {"bytes": path.stat().st_size}
