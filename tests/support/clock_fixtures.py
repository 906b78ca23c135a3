"""Issue 35, the one clock: videos with known presentation times, run through the real ingest and preprocess, and the
check every family's test module applies to every path that gives a model the time.

Two files are written here with PyAV (explicit pts):
- `vfr.mp4`: variable frame rate, 30 fps for 1 s, 5 fps for 2 s, 30 fps for 1 s (70 frames, 4 s); the decoder's
  average fps is 17.5, so `index / fps` is off by up to ~0.9 s;
- `late.mp4`: constant 10 fps, but its video track starts 0.5 s after its audio track (the container's start), so
  its first frame is shown at 0.5 s; OpenCV alone counts it from 0.

The rule checked (`check_given`): the time the model is given for each temporal patch equals the presentation time
of that patch's frames (text timestamps: their mean, as Qwen3-VL's processor; Qwen2.5-VL's native rope: the first
frame's, as `get_rope_index`), from the answer's origin (the window's start for shard paths and clips, the video's
start for the whole-video benchmark), within the family's resolution: text timestamps to their one decimal;
Qwen2.5-VL's native rope ids to 1 / tokens_per_second (floor). No expected time is ever computed by subtracting
the first frame's time.
"""

from __future__ import annotations

import fractions
import json
import math
import re
import tarfile
from pathlib import Path

import numpy as np
import torch

from support.train_fixtures import three_paths

REPO = Path(__file__).resolve().parents[2]
VFR_PTS = [i / 30 for i in range(30)] + [1.0 + k / 5 for k in range(10)] + [3.0 + k / 30 for k in range(30)]
LATE_START = 0.5
LATE_PTS = [LATE_START + i / 10 for i in range(30)]
EVENTS = {"vfr": (1.2, 2.6), "late": (1.5, 2.5)}
"""Each video's one event (a red square shown over it), in seconds on the file's timeline."""
TRUTH = {"vfr": VFR_PTS, "late": LATE_PTS}


def write_pts_video(path: Path, pts: list[float], event: tuple[float, float], size: int = 96,
                    audio_lead: bool = False) -> None:
    """An H.264 file whose frame i is shown at `pts[i]` seconds on its timeline (video track start included), noise
    texture (sharp: passes the quality filters) with a red square while `event` lasts; `audio_lead`: a silent audio
    track from 0, so the container starts at 0 and the video at pts[0]."""
    import av

    tb = fractions.Fraction(1, 90000)
    rng = np.random.default_rng(len(pts))
    with av.open(str(path), "w") as out:
        # the stream's nominal rate is its last interval's, so the container's last frame lasts what the decode side's
        # `vtg.clock.end_time` says it does
        v = out.add_stream("libx264", rate=round(1 / (pts[-1] - pts[-2])))
        v.width = v.height = size
        v.pix_fmt = "yuv420p"
        v.time_base = v.codec_context.time_base = tb
        v.options = {"bf": "0", "crf": "12"}
        a = out.add_stream("aac", rate=16000) if audio_lead else None
        if a is not None:
            for k in range(int(16000 * (pts[-1] + 0.5)) // 1024):
                frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, k * 1024
                out.mux(a.encode(frame))
        for t in pts:
            img = rng.integers(60, 200, (size, size, 3), dtype=np.uint8)
            if event[0] <= t < event[1]:
                img[20:60, 20:60] = (220, 30, 30)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts, frame.time_base = round(t / tb), tb
            out.mux(v.encode(frame))
        out.mux(v.encode())
        if a is not None:
            out.mux(a.encode())


def build_project(root: Path) -> dict:
    """Both videos, a native annotation file, the real ingest and the real preprocess (in process) -> paths."""
    from beam_jobs.preprocess import run
    from ingest import ingest
    from vtg.config import IngestConfig, load_config

    videos = root / "videos"
    videos.mkdir(parents=True)
    for name, pts in TRUTH.items():
        write_pts_video(videos / f"{name}.mp4", pts, EVENTS[name], audio_lead=name == "late")
    ann = root / "annotations.jsonl"
    ann.write_text("".join(json.dumps({"video_id": n, "query": f"the red square in {n}", "windows": [list(e)],
                                       "annotation_id": n}) + "\n" for n, e in EVENTS.items()))
    sources = [{"id": "clock", "licence": "CC0-1.0", "origin": "written by the test", "roots": [str(root)]}]
    ingest(IngestConfig(sources=sources, annotations=[str(ann)], video_root=str(videos),
                        out=str(root / "records.jsonl"), dead_letter=str(root / "dead.jsonl"),
                        summary=str(root / "summary.json")))
    cfg = load_config(REPO / "params.yaml", None, [
        f"preprocess.records={root / 'records.jsonl'}", f"preprocess.out_dir={root / 'shards'}",
        "preprocess.progress=false", "ingest.sources=" + json.dumps(sources), "preprocess.text_bias.enabled=false",
        "preprocess.num_frames=8", "preprocess.candidate_fps=30"])
    run(cfg, ["--direct_running_mode=in_memory", "--direct_num_workers=1"], show=False)
    return {"root": root, "videos": videos, "records": root / "records.jsonl", "shards": root / "shards",
            "sources": sources}


def samples(shards: Path) -> dict[str, tuple[dict, Path]]:
    """video id -> (its one sample's json, its split folder)."""
    out = {}
    for tar in sorted(shards.glob("*/shard-*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".json"):
                    meta = json.loads(t.extractfile(m).read())
                    out[meta["video_id"]] = (meta, tar.parent)
    return out


def patch_means(times: list[float], tp: int = 2) -> list[float]:
    """The mean presentation time of each temporal patch's frames (the last frame repeated to fill the last patch)."""
    t = list(times) + [times[-1]] * (-len(times) % tp)
    return [float(np.mean(t[i:i + tp])) for i in range(0, len(t), tp)]


def patch_firsts(times: list[float], tp: int = 2) -> list[float]:
    """The presentation time of each temporal patch's first frame (Qwen2.5-VL's rope time)."""
    return [float(t) for t in list(times)[::tp]]


def given_times(enc: dict, tokenizer, vision) -> tuple[str, list[float]]:
    """(how, the time each temporal patch is given): the `<t seconds>` texts, or Qwen2.5-VL's native temporal rope
    ids (what the model's forward and `generate` get: `position_ids`) over tokens_per_second."""
    text = tokenizer.decode(enc["input_ids"])
    stamps = re.findall(r"<(\d+\.\d) seconds><\|vision_start\|>", text)
    if stamps:
        return "text", [float(s) for s in stamps]
    pos = enc["position_ids"]
    video = enc["mm_token_type_ids"] == 2
    start = int(pos[1][video].min())  # the video's start position (its height ids count from it)
    per_patch = pos[0][video].view(int(enc["video_grid_thw"][0, 0]), -1)
    assert (per_patch == per_patch[:, :1]).all()
    return "rope", [(int(p) - start) / vision.tokens_per_second for p in per_patch[:, 0]]


def check_given(enc: dict, tokenizer, vision, frame_times: list[float], where: str) -> str:
    """Assert the issue's rule for one encoded example whose frames were shown at `frame_times` (seconds from the
    answer's origin); returns how the time was given."""
    how, given = given_times(enc, tokenizer, vision)
    want = (patch_means if how == "text" else patch_firsts)(frame_times, vision.temporal_patch_size)
    assert len(given) == len(want), where
    for g, (a, b) in enumerate(zip(given, want)):
        if how == "text":
            assert abs(a - b) <= 0.05 + 1e-6, f"{where}: patch {g} told {a} s, shown at {b:.4f} s"
        else:
            tps = vision.tokens_per_second
            assert a == math.floor(b * tps + 1e-6) / tps, f"{where}: patch {g} rope time {a} s, shown at {b:.4f} s"
            assert 0 <= b - a < 1 / tps, where
    return how


def check_every_path(model, tokenizer, project: dict, cfg_overrides: tuple[str, ...] = ()) -> set[str]:
    """Every path that gives `model` the time, on both videos: the stored times against the known pts, then the
    given times (SFT reader, RL rollout, windowed evaluation, the whole-video benchmark under both profiles,
    annotate's clip, a general-task clip). Returns the ways the time was given."""
    from annotate.run import Target, _clip
    from evaluation.benchmark import load_profile, sample_video
    from vtg.config import load_config
    from vtg.frames import clip_frames
    from vtg.model.processing import VisionParams, encode_example
    from vtg.records import read_records
    from vtg.sources import Sources

    vision = VisionParams.from_model(model)
    hows = set()
    found = samples(project["shards"])
    assert set(found) == set(TRUTH), found.keys()
    for vid, (meta, split_dir) in found.items():
        truth = TRUTH[vid]
        stored = meta["frame_timestamps"]
        shown = [truth[i] - meta["window_start_s"] for i in meta["frame_indices"]]
        assert max(abs(a - b) for a, b in zip(stored, shown)) < 1e-3, (vid, stored, shown)
        [q] = meta["queries"]
        assert q["windows"] == [[round(EVENTS[vid][0] - meta["window_start_s"], 6),
                                 round(EVENTS[vid][1] - meta["window_start_s"], 6)]]
        for path, enc in three_paths(model, tokenizer, split_dir.parent, split_dir.name).items():
            hows.add(check_given(enc, tokenizer, vision, shown, f"{vid} {path}"))
    cfg = load_config(REPO / "params.yaml", None, ["ingest.sources=" + json.dumps(project["sources"]),
                                                   *cfg_overrides])
    sources = Sources.of(project["sources"])
    for rec in read_records(project["records"]):
        truth = TRUTH[rec.video_id]
        assert abs(rec.duration_s - (truth[-1] + (truth[-1] - truth[-2]))) < 1e-3, rec  # ingest: the same clock
        for profile in ("full_video", "lmms_eval_charades"):
            path = sources.resolve(rec.video_owner, rec.video_path)
            frames, times = sample_video(rec, path, load_profile(profile), vision, cfg)
            assert all(any(abs(t - p) < 1e-3 for p in truth) for t in times), (rec.video_id, profile, times)
            enc = encode_example(tokenizer, frames, times, rec.query, None, vision=vision)
            hows.add(check_given(enc, tokenizer, vision, times, f"{rec.video_id} benchmark {profile}"))
        path = sources.resolve(rec.video_owner, rec.video_path)
        clip = _clip(Target(rec.video_id, rec.video_path, rec.video_owner, "CC0-1.0", rec.duration_s, False),
                     sources, cfg)
        start = 1.0  # a general-task clip from 1 s: its times count from there
        frames, times = clip_frames(path, start, None, 8, 56)
        for what, fr, ts, origin in (("annotate", clip.frames, clip.timestamps, 0.0), ("general task", frames, times,
                                                                                        start)):
            assert all(any(abs(t + origin - p) < 1e-3 for p in truth) for t in ts), (rec.video_id, what, ts)
            enc = encode_example(tokenizer, fr, ts, rec.query, None, vision=vision)
            hows.add(check_given(enc, tokenizer, vision, ts, f"{rec.video_id} {what}"))
    return hows


def model_is_told(model, enc: dict) -> torch.Tensor:
    """The logits the model computes for an encoded example as every path feeds it (`model_inputs`)."""
    from vtg.model.processing import collate, model_inputs

    batch = model_inputs(collate([enc], 0), "cpu", model.dtype)
    batch.pop("labels", None)
    with torch.no_grad():
        return model(**batch).logits
