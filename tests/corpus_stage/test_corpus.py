"""Synthetic corpus: determinism by seed and ground truth that matches the written files."""

import hashlib
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import cv2
import pytest

from corpus import DEFECT_KINDS, INVALID_KINDS, build_corpus
from corpus.__main__ import main as corpus_main


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_bytes_regardless_of_workers(tmp_path, small_corpus, corpus_config):
    cfg, _ = small_corpus
    again = build_corpus(corpus_config(tmp_path / "again", workers=2))
    assert again["videos"]
    ref = digests(Path(cfg.out_dir))
    out = digests(tmp_path / "again")
    assert ref == out and len(ref) > 12


def test_different_seed_gives_different_files(tmp_path, small_corpus, corpus_config):
    cfg, gt = small_corpus
    other = build_corpus(corpus_config(tmp_path / "other", seed=1))
    a, b = digests(Path(cfg.out_dir)), digests(tmp_path / "other")
    assert a.keys() & b.keys()
    assert sum(a[k] != b[k] for k in a.keys() & b.keys()) > len(a) // 2
    assert [e["query"] for v in gt["videos"] for e in v["events"]] != \
        [e["query"] for v in other["videos"] for e in v["events"]]


def test_ground_truth_describes_the_written_videos(small_corpus):
    cfg, gt = small_corpus
    root = Path(cfg.out_dir)
    for v in gt["videos"]:
        path = root / v["path"]
        assert path.is_file()
        assert math.isclose(v["duration_s"], v["n_frames"] / v["fps"])
        scenes = v["scenes"]
        assert scenes[0]["start_frame"] == 0 and scenes[-1]["end_frame"] == v["n_frames"]
        assert all(a["end_frame"] == b["start_frame"] for a, b in itertools.pairwise(scenes))
        starts = {s["start_frame"] for s in scenes[1:]}
        for c in v["hard_cuts"]:
            assert c in starts
        for a, b in v["gradual_transitions"]:
            assert 0 < a < b < v["n_frames"] and any(a < s <= b for s in starts)
        for e in v["events"]:
            assert 0 <= e["start_s"] < e["end_s"] <= v["duration_s"] + 1e-9
        if not v["readable"]:
            cap = cv2.VideoCapture(str(path))
            assert not cap.isOpened() or not cap.read()[0] or v["defect"]["kind"] == "truncated"
            continue
        cap = cv2.VideoCapture(str(path))
        n = 0
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            assert frame.shape[:2] == (v["height"], v["width"])
            n += 1
        assert n == v["n_frames"], v["video_id"]
        assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(v["fps"])


def test_defects_and_query_kinds_are_all_present_and_labelled(small_corpus):
    cfg, gt = small_corpus
    videos = {v["video_id"]: v for v in gt["videos"]}
    kinds = Counter(v["defect"]["kind"] for v in videos.values())
    assert set(DEFECT_KINDS) <= set(kinds) and kinds["none"] == 12
    root = Path(cfg.out_dir)
    for v in videos.values():
        kind = v["defect"]["kind"]
        size = (root / v["path"]).stat().st_size
        if kind == "zero_byte":
            assert size == 0
        elif kind == "not_video":
            assert (root / v["path"]).read_bytes().isascii()
        elif kind == "near_duplicate":
            src = videos[v["defect"]["of"]]
            trim = v["defect"]["transform"]["trim_start_s"]
            assert src["defect"]["kind"] == "none"
            assert v["duration_s"] == pytest.approx(src["duration_s"] - trim)
            src_events = {e["query"]: e for e in src["events"]}
            for e in v["events"]:
                assert e["end_s"] == pytest.approx(src_events[e["query"]]["end_s"] - trim)
        elif kind == "low_res":
            assert (v["width"], v["height"]) == (24, 24)
    events = [e for v in videos.values() for e in v["events"]]
    by_id = {e["annotation_id"]: e for e in events}
    assert len(by_id) == len(events)
    qkinds = Counter(e["kind"] for e in events)
    assert qkinds["normal"] > 0 and qkinds["text_answerable"] > 0 and qkinds["duplicate_query"] > 0
    for e in events:
        if e["kind"] == "duplicate_query":
            orig = by_id[e["of"]]
            assert (orig["start_s"], orig["end_s"]) == (e["start_s"], e["end_s"])
            assert orig["query"].lower().split() == e["query"].lower().rstrip(".").split()
        if e["kind"] == "text_answerable":
            v = next(v for v in videos.values() if e in v["events"])
            assert e["start_s"] == 0 or e["end_s"] == pytest.approx(v["duration_s"])
    assert {x["reason"] for x in gt["invalid_annotations"]} == set(INVALID_KINDS)


def test_qvhighlights_annotation_file_matches_ground_truth(small_corpus):
    cfg, gt = small_corpus
    lines = (Path(cfg.out_dir) / gt["annotation_file"]).read_text().splitlines()
    assert len(lines) == gt["annotation_lines"]
    invalid = {x["line"] for x in gt["invalid_annotations"]}
    events = {e["annotation_id"]: (v, e) for v in gt["videos"] for e in v["events"]}
    clipped = {x["annotation_id"]: x for x in gt["clipped_annotations"]}
    for no, line in enumerate(lines, 1):
        if no in invalid:
            continue
        obj = json.loads(line)
        v, e = events.pop(str(obj["qid"]))
        assert obj["vid"] == v["video_id"] and obj["query"] == e["query"]
        assert obj["duration"] == pytest.approx(v["duration_s"])
        (s, end), = obj["relevant_windows"]
        assert s == pytest.approx(e["start_s"])
        assert end == pytest.approx(clipped[str(obj["qid"])]["end_s_written"] if str(obj["qid"]) in clipped
                                    else e["end_s"])
    assert not events  # every ground-truth event has exactly one annotation line


@pytest.mark.parametrize("fmt", ["charades", "activitynet", "jsonl"])
def test_other_annotation_formats_write_one_item_per_event(tmp_path, fmt, corpus_config):
    gt = build_corpus(corpus_config(tmp_path / fmt, n_videos=3, annotation_format=fmt, defect_fraction=0.0))
    text = (tmp_path / fmt / gt["annotation_file"]).read_text()
    n_events = sum(len(v["events"]) for v in gt["videos"])
    if fmt == "activitynet":
        data = json.loads(text)
        assert sum(len(e["sentences"]) for e in data.values() if isinstance(e["timestamps"], list)) + 1 == \
            n_events + len(gt["invalid_annotations"])
    else:
        assert len(text.splitlines()) == n_events + len(gt["invalid_annotations"])


def test_cli_builds_skips_when_up_to_date_and_dry_runs(tmp_path, capsys, repo_root):
    args = ["--params", str(repo_root / "params.yaml"), f"corpus.out_dir={tmp_path / 'c'}", "corpus.n_videos=2",
            "corpus.defect_fraction=0", "corpus.workers=1"]
    assert corpus_main(args) == 0
    assert "videos" in capsys.readouterr().out
    assert corpus_main(args) == 0
    assert "up to date" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        corpus_main([*args, "--dry-run"])
    assert "n_videos: 2" in capsys.readouterr().out


def test_refuses_to_overwrite_a_directory_that_is_not_a_corpus(tmp_path, corpus_config):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("x")
    from vtg.errors import VTGError
    with pytest.raises(VTGError, match="not a synthetic corpus"):
        build_corpus(corpus_config(tmp_path / "mine", n_videos=1))
    assert (tmp_path / "mine" / "precious.txt").exists()


def test_default_plan_has_the_intended_mix():
    """The corpus planner at the settings this test was measured with (`CORPUS_MEASURED`, 320 clean videos; plans
    only, no pixels): mix of query kinds, event lengths, positions, long videos."""
    from collections import defaultdict

    import numpy as np
    from support.measured_settings import CORPUS_MEASURED

    from corpus.plan import plan_corpus
    from vtg.config import CorpusConfig

    cfg = CorpusConfig(**CORPUS_MEASURED)
    plans = plan_corpus(cfg)
    clean = [p for p in plans if p["defect"]["kind"] == "none"]
    assert len(clean) == cfg.n_videos
    events = [(p, e) for p in clean for e in p["events"]]
    kinds = Counter(e["kind"] for _, e in events)
    assert 0.05 <= kinds["text_answerable"] / len(events) <= 0.10
    normal = [(p, e) for p, e in events if e["kind"] == "normal"]
    assert all(2 * cfg.fps <= e["end_frame"] - e["start_frame"] <= 8 * cfg.fps for _, e in normal)
    assert all(1 <= sum(e["kind"] == "normal" for e in p["events"]) for p in clean)
    assert sum(bool(p["gradual_transitions"]) for p in clean) >= 0.4 * len(clean)
    long = [p for p in clean if p["n_frames"] > cfg.max_duration_s * cfg.fps]
    assert len(long) >= 0.05 * len(clean)
    for p in long:  # events of long videos stay inside one scene
        for e in p["events"]:
            if e["kind"] == "normal":
                assert any(s["start_frame"] <= e["start_frame"] and e["end_frame"] <= s["end_frame"]
                           for s in p["scenes"])
    # Position is not predictable from the wording of normal queries: per phrase, centres spread widely.
    centres = defaultdict(list)
    for p, e in normal:
        words = e["query"].split()
        centres[" ".join(words[:1] + words[3:])].append((e["start_frame"] + e["end_frame"]) / 2 / p["n_frames"])
    assert all(np.std(c) > 0.15 for c in centres.values() if len(c) >= 20)
    assert len({e["query"] for _, e in normal}) > 100


def test_unwritable_out_dir_is_a_one_line_error(tmp_path, corpus_config):
    from corpus import load_ground_truth
    from vtg.errors import VTGError

    (tmp_path / "afile").write_text("")
    with pytest.raises(VTGError, match="cannot write the corpus"):
        build_corpus(corpus_config(tmp_path / "afile" / "corpus", n_videos=1))
    with pytest.raises(VTGError, match="build the corpus first"):
        load_ground_truth(tmp_path)


def test_blur_defect_scales_with_the_frame_size():
    """The job scores blur at one analysis size (56 px): a blur of fixed source pixels would fade away on larger
    videos (sigma 6 at 448 px is 0.75 px at 56 px: 4 blurred 448-px videos were kept as sharp)."""
    from support.measured_settings import CORPUS_MEASURED

    from corpus.plan import plan_defect_video
    from vtg.config import CorpusConfig

    sigmas = {size: plan_defect_video(CorpusConfig(**CORPUS_MEASURED, width=size, height=size), 0, "blurred",
                                      [])["defect"]["sigma"]
              for size in (112, 224, 448)}
    assert sigmas == {112: 6.0, 224: 12.0, 448: 24.0}
