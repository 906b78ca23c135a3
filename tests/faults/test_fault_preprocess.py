"""Issue 15 item 2: no video crashes the preprocess job. A video too short to split and sample is filtered
`too_short`; any exception while one video is processed dead-letters that video's records
(`processing_error`, with the exception type, message and stage) and the other videos are still written; the
manifest reconciles (inputs = kept + filtered + failed)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np

from beam_jobs import preprocess, transforms
from vtg.config import load_config

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def write_video(path: Path, n_frames: int, fps: float = 8.0, size: int = 96, seed: int = 0) -> None:
    """Two textured scenes (a cut half-way) with a moving square; n_frames may be 1 or 2."""
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (size, size))
    xx = np.mgrid[0:size, 0:size][1]
    for t in range(n_frames):
        rng = np.random.default_rng(seed * 10 + (2 * t >= n_frames))
        base, period = rng.integers(40, 200, 3), int(rng.integers(6, 20))
        img = (base[None, None, :] * (0.6 + 0.4 * ((xx // period) % 2)[..., None])).astype(np.uint8)
        x = (5 + 2 * t) % (size - 20)
        img[20:36, x:x + 16] = (0, 0, 255)
        out.write(img)
    out.release()


def rec(vid: str, path: Path, duration: float, window: tuple[float, float], aid: str) -> dict:
    return {"video_id": vid, "video_path": str(path), "duration_s": duration, "query": f"the square moves ({aid})",
            "windows": [list(window)], "source": "test:faults", "annotation_id": aid}


def run_job(tmp_path: Path, videos: dict[str, tuple[int, float]]) -> tuple[dict, list[dict], list[dict]]:
    """videos: id -> (frames, fps); two queries per video (one for a 1-frame video). -> manifest, dead, filtered."""
    vdir = tmp_path / "videos"
    vdir.mkdir()
    rows = []
    for k, (vid, (n, fps)) in enumerate(videos.items()):
        write_video(vdir / f"{vid}.mp4", n, fps, seed=k + 1)
        dur = n / fps
        rows.append(rec(vid, vdir / f"{vid}.mp4", dur, (0.0, dur * 0.4), f"{vid}-q1"))
        if n > 1:
            rows.append(rec(vid, vdir / f"{vid}.mp4", dur, (dur * 0.5, dur * 0.9), f"{vid}-q2"))
    return run_rows(tmp_path, rows)


def run_rows(tmp_path: Path, rows: list[dict]) -> tuple[dict, list[dict], list[dict]]:
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "shards"
    cfg = load_config(REPO / "params.yaml", None, [f"preprocess.records={records}", f"preprocess.out_dir={out}",
                                                    "preprocess.progress=false", "preprocess.text_bias.enabled=false"])
    manifest = preprocess.run(cfg, IN_PROCESS, show=False)
    dead = [json.loads(x) for x in (out / "dead_letter.jsonl").read_text().splitlines()]
    filtered = [json.loads(x) for x in (out / "filtered.jsonl").read_text().splitlines()]
    rec_ = manifest["records"]
    assert rec_["inputs"] == len(rows) == rec_["kept"] + rec_["filtered"] + rec_["failed"]
    assert rec_["failed"] == len(dead) and rec_["filtered"] == len(filtered)
    return manifest, dead, filtered


def kept_videos(manifest: dict, out: Path) -> set[str]:
    import webdataset as wds

    vids = set()
    for s in manifest["shards"]:
        for sample in wds.WebDataset(str(out / s["path"]), shardshuffle=False):
            vids.add(json.loads(sample["json"])["video_id"])
    return vids


def test_one_frame_and_near_zero_second_videos_are_filtered_too_short(tmp_path):
    # "one": a single frame (crashed the whole job in the scene detector); "blip": 2 frames at 100 fps (0.02 s)
    manifest, dead, filtered = run_job(tmp_path, {"good": (80, 8.0), "one": (1, 8.0), "blip": (2, 100.0)})
    short = {r["annotation_id"]: r for r in filtered if r["reason"] == "too_short"}
    assert set(short) == {"one-q1", "blip-q1", "blip-q2"}
    assert "1 frame" in short["one-q1"]["detail"] and "0.02" in short["blip-q1"]["detail"]
    assert manifest["dropped_per_reason"]["too_short"] == 3
    assert not dead and manifest["records"]["failed"] == 0
    assert "good" in kept_videos(manifest, tmp_path / "shards")


def test_an_exception_in_one_video_dead_letters_only_that_video(tmp_path, monkeypatch):
    real_build, real_sig, real_decode = transforms.build_windows, transforms.video_signature, transforms.decode

    def build_windows(video_id, records, video, cfg):
        if video_id == "bad_windows":
            raise RuntimeError("injected fault in build_windows")
        return real_build(video_id, records, video, cfg)

    def video_signature(video_id, *a, **kw):
        if video_id == "bad_sig":  # after the windows were built: none of them may leak out
            raise KeyError("injected fault in video_signature")
        return real_sig(video_id, *a, **kw)

    def decode(path, cfg, **kw):
        if "bad_decode" in path:
            raise ZeroDivisionError("injected fault in decode")
        return real_decode(path, cfg, **kw)

    monkeypatch.setattr(transforms, "build_windows", build_windows)
    monkeypatch.setattr(transforms, "video_signature", video_signature)
    monkeypatch.setattr(transforms, "decode", decode)
    videos = {v: (40, 8.0) for v in ("good", "bad_windows", "bad_sig", "bad_decode")}
    manifest, dead, _ = run_job(tmp_path, videos)
    assert manifest["failed_per_reason"] == {"processing_error": 6}
    by_video = {}
    for d in dead:
        by_video.setdefault(d["video_id"], []).append(d)
    assert {v: len(ds) for v, ds in by_video.items()} == {"bad_windows": 2, "bad_sig": 2, "bad_decode": 2}
    expect = {"bad_windows": ("RuntimeError", "build_windows", "injected fault in build_windows"),
              "bad_sig": ("KeyError", "signature", "injected fault in video_signature"),
              "bad_decode": ("ZeroDivisionError", "decode", "injected fault in decode")}
    for vid, (etype, stage, msg) in expect.items():
        for d in by_video[vid]:
            assert d["reason"] == "processing_error" and d["error_type"] == etype and d["stage"] == stage
            assert msg in d["error"] and d["annotation_id"].startswith(vid)
    assert kept_videos(manifest, tmp_path / "shards") <= {"good"}
    assert manifest["records"]["kept"] + manifest["records"]["filtered"] == 2  # good's two queries
    assert manifest["samples_per_split"] and "good" in kept_videos(manifest, tmp_path / "shards")


def test_one_line_with_a_wrong_duration_rejects_that_line_not_the_video(tmp_path):
    """Issue 21 case 1: one line claiming 125 s for a 12.5 s clip dead-lettered every query of the video as
    `unreadable_video: truncated` (advice: replace the file). Now only that line is rejected."""
    vdir = tmp_path / "videos"
    vdir.mkdir()
    write_video(vdir / "clip.mp4", 100, 8.0, seed=3)  # 12.5 s
    rows = [rec("clip", vdir / "clip.mp4", 12.5, (0.5 + i, 3.0 + i), f"q{i}") for i in range(3)]
    rows.append(rec("clip", vdir / "clip.mp4", 125.0, (1.0, 4.0), "wrong"))
    manifest, dead, _ = run_rows(tmp_path, rows)
    assert [(d["annotation_id"], d["reason"]) for d in dead] == [("wrong", "duration_mismatch")]
    assert "125 s" in dead[0]["error"] and "12.50 s" in dead[0]["error"]
    assert manifest["records"]["kept"] + manifest["records"]["filtered"] == 3


def test_one_id_for_two_files_is_a_dead_letter_never_a_merge(tmp_path):
    """Issue 21 case 1: two videos under one id became one sample whose frames were one video's and whose queries
    the other's, silently."""
    vdir = tmp_path / "videos"
    vdir.mkdir()
    write_video(vdir / "a.mp4", 80, 8.0, seed=1)
    write_video(vdir / "b.mp4", 80, 8.0, seed=2)
    write_video(vdir / "c.mp4", 80, 8.0, seed=4)
    rows = [rec("same", vdir / "a.mp4", 10.0, (0.5, 3.0), "from-a"), rec("same", vdir / "b.mp4", 10.0, (5.0, 8.0),
            "from-b"), rec("c", vdir / "c.mp4", 10.0, (1.0, 4.0), "c-q1")]
    manifest, dead, _ = run_rows(tmp_path, rows)
    assert sorted((d["annotation_id"], d["reason"]) for d in dead) == [("from-a", "ambiguous_video_id"),
                                                                        ("from-b", "ambiguous_video_id")]
    assert "a.mp4" in dead[0]["error"] and "b.mp4" in dead[0]["error"]
    assert "same" not in kept_videos(manifest, tmp_path / "shards")
