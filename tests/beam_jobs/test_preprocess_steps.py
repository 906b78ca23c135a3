"""Each pure step of the preprocess job on tiny inputs."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from datasketch import MinHashLSH

from beam_jobs import dedup, frames, probe, quality, scenes, summary, text_bias
from beam_jobs.probe import DecodeError, decode_video
from beam_jobs.sink import query_verdict, sample_key
from vtg.config.preprocess import QualityConfig
from vtg.splits import split_of


def test_decode_once_finds_hard_cuts_and_rejects_bad_files(tmp_path, write_video):
    cuts = write_video(tmp_path / "v.mp4", [(1, 20), (2, 20), (3, 16)])
    v = decode_video(str(tmp_path / "v.mp4"), frame_size=28, candidate_fps=4.0, cut_threshold=15.0)
    assert v.n_frames == 56 and v.fps == 8.0 and v.hard_cuts == cuts == [20, 40]
    assert list(v.cand_idx) == list(range(0, 56, 2)) and v.cand_frames[0].shape == (28, 28, 3)
    (tmp_path / "zero.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("hello")
    data = (tmp_path / "v.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 2])
    for name, msg in (("zero.mp4", "zero-byte"), ("text.mp4", "not a decodable"), ("cut.mp4", "truncated|not a decodable|no frame"),
                      ("missing.mp4", "not found")):
        for threads in (0, 1):  # bad files fail the same way whatever the decoder threading
            with pytest.raises(DecodeError, match=msg):
                decode_video(str(tmp_path / name), frame_size=28, candidate_fps=4.0, decode_threads=threads)
    # One decoder thread (the job's default) and OpenCV's default threading give the same frames.
    one = decode_video(str(tmp_path / "v.mp4"), frame_size=28, candidate_fps=4.0, cut_threshold=15.0, decode_threads=1)
    assert (one.thumbs == v.thumbs).all() and one.hard_cuts == v.hard_cuts
    assert all((a == b).all() for a, b in zip(one.cand_frames, v.cand_frames, strict=True))
    with pytest.raises(DecodeError, match="truncated"):
        decode_video(str(tmp_path / "v.mp4"), frame_size=28, candidate_fps=4.0, expected_duration_s=20.0)


def test_large_frames_are_halved_first_and_still_find_the_cuts(tmp_path, write_video):
    assert [probe.prescale_halvings(s, s, 56) for s in (84, 112, 140, 222, 224, 446, 448, 900)] == \
        [0, 0, 0, 0, 1, 1, 2, 2]
    assert probe.prescale_halvings(1920, 1080, 56) == 3 and probe.prescale_halvings(450, 451, 56) == 0
    assert probe.prescale_halvings(224, 224, 28) == 2  # 224 -> 112 -> 56 first, then the area resizes to 28 and 16
    cuts = write_video(tmp_path / "big.mp4", [(1, 20), (2, 20), (3, 16)], size=224)
    v = decode_video(str(tmp_path / "big.mp4"), frame_size=28, candidate_fps=4.0, cut_threshold=15.0)
    assert v.hard_cuts == cuts == [20, 40]
    cap = cv2.VideoCapture(str(tmp_path / "big.mp4"))
    _, first = cap.read()
    cap.release()
    for got, side in ((v.thumbs[0], 16), (v.cand_frames[0], 28)):  # within 1 level of the one-step area means
        direct = cv2.resize(first, (side, side), interpolation=cv2.INTER_AREA)
        assert np.abs(got.astype(int) - direct.astype(int)).max() <= 1


def test_object_appearing_on_a_still_scene_is_not_a_cut():
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(2))
    with_object = a.copy()
    with_object[4:11, 4:11] = (0, 0, 255)  # a big red square appears: 19% of the cells
    thumbs = np.stack([a] * 10 + [with_object] * 10 + [b] * 10)
    got = {}
    for gate in (0.0, 0.5):
        cutter = scenes.ContentCuts(8.0, 15.0, 1, "batched", gate)
        cutter.push_all(thumbs)
        per_frame = scenes.ContentCuts(8.0, 15.0, 1, "batched", gate)
        for i, t in enumerate(thumbs):
            per_frame.push(i, t)
        got[gate] = cutter.finish()
        assert per_frame.finish() == got[gate]  # frame by frame and all at once agree
    assert got == {0.0: [10, 20], 0.5: [20]}  # plain ContentDetector calls the appearance a cut; the gate does not


def test_gradual_transition_is_found_inside_its_span(tmp_path, write_video):
    write_video(tmp_path / "d.mp4", [(3, 40), (4, 40)], dissolve=16)  # frames 32-47
    v = decode_video(str(tmp_path / "d.mp4"), frame_size=28, candidate_fps=4.0, cut_threshold=15.0)
    spans = scenes.gradual_transitions(v.thumbs, reach=4, high=15.0, min_frames=4, hard_cuts=v.hard_cuts)
    bounds = scenes.scene_boundaries(v.hard_cuts, spans, v.times)
    assert bounds and all(32 / 8 <= b <= 48 / 8 for b in bounds)  # found within the dissolve, nowhere else


def test_object_moving_on_a_still_scene_is_not_a_gradual_transition():
    rng = np.random.default_rng(1)
    a, b = (rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(2))
    thumbs = [a] * 20 + [((1 - k / 9) * a + k / 9 * b).astype(np.uint8) for k in range(1, 9)] + [b] * 60
    for i in range(28, 60):  # right after the dissolve (frames 20-27) a big red square crosses scene b
        thumbs[i] = b.copy()
        thumbs[i][4:11, (i - 28) % 10:(i - 28) % 10 + 7] = (0, 0, 255)
    thumbs = np.stack(thumbs)
    got = {gate: scenes.gradual_transitions(thumbs, reach=4, high=15.0, min_frames=4, min_changed=gate)
           for gate in (0.0, 0.5)}
    # Without the share test the object's jumps and its exit are transitions too; with it only the dissolve is
    # left, its middle inside frames 20-27.
    outside = [s for s in got[0.0] if not 20 <= sum(s) / 2 <= 28]
    assert len(got[0.0]) - len(outside) == 1 and len(outside) >= 2, got
    assert len(got[0.5]) == 1 and 20 <= sum(got[0.5][0]) / 2 <= 28, got


def test_windows_cut_at_scene_bounds_outside_moments():
    bounds = [8.0, 14.0, 22.0, 35.0]
    assert scenes.plan_windows(20.0, bounds, 30.0) == [(0.0, 20.0)]
    w = scenes.plan_windows(40.0, bounds, 15.0, moments=[(13.0, 16.0)])
    assert w == [(0.0, 8.0), (8.0, 22.0), (22.0, 35.0), (35.0, 40.0)]  # 14.0 lies inside the moment
    assert scenes.plan_windows(40.0, [], 15.0) == [(0.0, 15.0), (15.0, 30.0), (30.0, 40.0)]
    assert scenes.assign_window(w, [(13.0, 16.0)]) == 1
    assert scenes.assign_window(w, [(20.0, 23.0)]) is None  # moment_crosses_window
    assert scenes.rebase([(13.0, 16.0)], w[1]) == [(5.0, 8.0)]


def test_uniform_and_adaptive_frames_share_the_budget():
    cand_t = np.arange(80) / 8.0
    u = frames.uniform_frames(cand_t, 0.0, 10.0, 8)
    # the processors' rule: linspace from the window's first frame to its last (issue 35)
    assert list(cand_t[u]) == [0.0, 1.375, 2.875, 4.25, 5.625, 7.0, 8.5, 9.875]
    assert len(frames.uniform_frames(cand_t, 0.0, 10.0, 8, fps=2.0)) == 20
    change = np.zeros(80)
    change[40:44] = 50.0  # a burst of change at 5.0-5.5 s
    a = frames.adaptive_frames(cand_t, change, 0.0, 10.0, 8, mix=0.5)
    assert len(a) == 8 and len(set(a)) == 8 and list(a) == sorted(a)
    near = np.sum(np.abs(cand_t[a] - 5.25) < 1.0)
    assert near > np.sum(np.abs(cand_t[u] - 5.25) < 1.0)
    assert list(frames.candidate_change(np.arange(10.0), np.array([0, 4, 8]))) == [0.0, 4.0, 8.0]


def _step_frame(contrast: int, size: int = 56) -> np.ndarray:
    img = np.full((size, size, 3), 100, np.uint8)
    img[:, size // 2:] += np.uint8(contrast)  # a vertical step edge, `contrast` levels in every channel
    cv2.circle(img, (size // 4, size // 4), size // 8, (100 + contrast, 100, 100 - contrast), -1)
    return img


def test_edge_width_is_contrast_free_and_widens_with_blur():
    faint, strong = quality.edge_width(_step_frame(20)), quality.edge_width(_step_frame(120))
    assert faint == strong <= 2.0  # plain but sharp: a step crosses its range in 2 px at any contrast
    blurred = [quality.edge_width(cv2.GaussianBlur(_step_frame(c), (0, 0), 3.0)) for c in (20, 120)]
    assert all(b > QualityConfig().max_edge_width for b in blurred), blurred
    assert np.isnan(quality.edge_width(np.full((56, 56, 3), 90, np.uint8)))  # flat: no edge to judge
    assert np.isnan(quality.edge_width(_step_frame(10)))  # 3 x 10 levels < EDGE_MIN_CONTRAST: noise, not an edge
    assert 1.0 <= quality.edge_width(_step_frame(60)[:, :, 0]) <= 2.0  # grey frames too


def test_quality_reasons():
    cfg = QualityConfig()
    scores = quality.window_quality(np.array([2.0, np.nan, 3.0, 2.5]), np.array([120.0, 130.0]),
                                    np.array([200.0, 210.0]), 112, 112)
    assert scores == {"resolution": 112.0, "edge_width": 2.1, "brightness": 125.0, "highlight": 205.0}  # p10 of
    # the frames with edges
    assert quality.window_quality(np.array([np.nan]), np.array([50.0]), np.array([90.0]), 64, 80)["edge_width"] == 0.0
    assert quality.quality_drop_reason(scores, cfg) is None
    assert quality.quality_drop_reason({**scores, "resolution": 24.0}, cfg) == "low_resolution"
    assert quality.quality_drop_reason({**scores, "brightness": 10.0, "highlight": 30.0, "edge_width": 9.0},
                                       cfg) == "too_dark"
    assert quality.quality_drop_reason({**scores, "brightness": 18.0}, cfg) is None  # a title card: bright text
    assert quality.quality_drop_reason({**scores, "brightness": 250.0}, cfg) == "washed_out"
    assert quality.quality_drop_reason({**scores, "edge_width": 5.0}, cfg) == "blurry"


def test_band_keys_reproduce_minhashlsh_candidates():
    from datasketch import MinHash

    rng = np.random.default_rng(0)
    base = [int(x) for x in rng.integers(0, 2**63, 200)]
    docs = {"a": base, "b": base[:170] + [int(x) for x in rng.integers(0, 2**63, 30)],
            "c": [int(x) for x in rng.integers(0, 2**63, 200)]}
    mh = dict(zip(docs, MinHash.bulk([[x.to_bytes(8, "big") for x in d] for d in docs.values()],
                                     num_perm=128, seed=1)))
    sigs = dict(zip(docs, dedup.signatures(list(docs.values()), 128, 1)))
    lsh = MinHashLSH(num_perm=128, params=(32, 4))
    for k, m in mh.items():
        assert (m.hashvalues == sigs[k]).all()
        assert (dedup.signatures([docs[k]], 128, 1)[0] == sigs[k]).all()  # one set at a time (the job's way)
        lsh.insert(k, m)
    buckets: dict = {}
    for k, hv in sigs.items():
        for key in dedup.band_keys(hv, 32):
            buckets.setdefault(key, set()).add(k)
    for k, m in mh.items():
        ours = set().union(*(b for b in buckets.values() if k in b))
        assert set(lsh.query(m)) == ours
    assert "b" in set(lsh.query(mh["a"])) and "c" not in set(lsh.query(mh["a"]))


def test_clusters_resolve_deterministically():
    rank = {"x": (0,), "y": (-1,), "z": (0,), "p": (0,), "q": (0,)}
    edges = [("x", "y"), ("y", "z"), ("p", "q")]
    out = dedup.resolve_clusters(edges, rank)
    assert out == dedup.resolve_clusters(list(reversed(edges)), rank)
    assert out == {"x": "y", "y": "y", "z": "y", "p": "p", "q": "p"}
    assert dedup.candidate_pairs(["b", "a", "b"]) == [("a", "b")]
    assert dedup.query_shingles("The red  circle.", 2) == dedup.query_shingles("the red circle", 2)


def test_video_shingles_survive_a_reencode(tmp_path, write_video):
    import cv2

    write_video(tmp_path / "a.mp4", [(1, 40), (2, 40), (5, 40)])
    write_video(tmp_path / "b.mp4", [(1, 40), (2, 40), (5, 40)],
                post=lambda f: cv2.convertScaleAbs(cv2.resize(f, (80, 80)), alpha=1.0, beta=10))
    write_video(tmp_path / "c.mp4", [(7, 40), (9, 40), (11, 40)])
    sh = {k: dedup.video_shingles(decode_video(str(tmp_path / f"{k}.mp4"), frame_size=28,
                                               candidate_fps=2.0).thumbs, 8.0, 2.0, 2) for k in "abc"}
    assert dedup.jaccard(sh["a"], sh["b"]) >= 0.6  # same content re-encoded
    assert dedup.jaccard(sh["a"], sh["c"]) <= 0.3  # other content


def test_blind_predictor_is_cross_fitted():
    stats: dict = {}
    rows = [(f"v{i}", "the opening title card", [(0.0, 2.0)], 10.0 + i) for i in range(12)]
    for vid, q, w, d in rows:
        for (tok, param), st in text_bias.token_stats(q, w, d):
            key = (param, text_bias.fold_of(vid, 3))
            stats.setdefault(tok, {})[key] = text_bias.add_stats([stats[tok].get(key, (0,) * 5), st]) \
                if key in stats.get(tok, {}) else st
    pred = text_bias.blind_predict("the opening title card", 15.0, 0, stats, min_count=3, max_std=0.08)
    assert pred is not None and text_bias.blind_iou(pred, [(0.0, 2.0)]) > 0.9
    assert text_bias.blind_predict("a red circle", 15.0, 0, stats, 3, 0.08) is None
    one = {"solo": {("start", 0): (1, 0, 0, 2_000_000, 4 * 10**12)}}
    assert text_bias.blind_predict("solo", 10.0, 0, one, 1, 0.5) is None  # its own fold never scores it
    assert text_bias.blind_predict("solo", 10.0, 1, one, 1, 0.5) == (0.0, 2.0)


def test_partition_is_stable_and_additive():
    fr = {"train": 0.8, "val": 0.1, "test": 0.1}
    old = {f"v{i}": split_of(f"v{i}", fr) for i in range(2000)}
    assert old == {f"v{i}": split_of(f"v{i}", fr) for i in range(2000)}
    counts = {s: sum(v == s for v in old.values()) for s in fr}
    assert 0.75 < counts["train"] / 2000 < 0.85 and counts["val"] > 150 and counts["test"] > 150


def test_manifest_reconciles_or_raises():
    cells = {("kept", "train", 0, 1): 3, ("filtered", "blurry", 2, 3): 1, ("failed", "unreadable_video", 0, 1): 1}
    m = summary.build_manifest(n_inputs=5, cells=cells, window_events={}, shards=[], n_dead=1, lineage={},
                               bins=4)
    assert m["records"] == {"inputs": 5, "kept": 3, "filtered": 1, "failed": 1}
    assert m["location_bias"]["all"]["start"] == [4, 0, 1, 0]
    with pytest.raises(summary.ReconcileError):
        summary.build_manifest(n_inputs=6, cells=cells, window_events={}, shards=[], n_dead=1, lineage={},
                               bins=4)


def test_keys_and_verdicts():
    assert sample_key("RoripwjYFp8_60.0_210.0", 3) == "RoripwjYFp8_60_0_210_0-0003"
    assert query_verdict("a", "b", 0.9, 0.5, True) == "duplicate_query"
    assert query_verdict("a", "a", 0.9, 0.5, True) == "text_answerable"
    assert query_verdict("a", None, 0.9, 0.5, False) is None


def test_batched_cuts_equal_pyscenedetect_contentdetector(tmp_path, write_video):
    write_video(tmp_path / "v.mp4", [(1, 20), (2, 6), (3, 30), (4, 24)], dissolve=6)
    for min_len, size in ((0.1, 16), (0.5, 16), (2.0, 16), (0.5, 64)):  # 16: all thumbnails at once after decode
        got = [decode_video(str(tmp_path / "v.mp4"), frame_size=28, candidate_fps=2.0, cut_threshold=15.0,
                            min_scene_len_s=min_len, detect_size=size, engine=e).hard_cuts
               for e in ("batched", "pyscenedetect")]
        assert got[0] == got[1] and got[0], (min_len, size, got)
