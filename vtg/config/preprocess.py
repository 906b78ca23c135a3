"""`preprocess`: the Beam job that turns canonical records + videos into WebDataset shards."""

from typing import Literal

from pydantic import Field, field_validator, model_validator

from vtg.config._base import NOT_OUTPUT, Section
from vtg.model.families import QWEN3_VL

RUNNER_PROFILES = {
    "direct": ["--runner=DirectRunner", "--direct_running_mode=multi_processing"],
    "dataflow": ["--runner=DataflowRunner", "--project=my-gcp-project", "--region=us-central1",
                 "--temp_location=gs://my-bucket/beam-tmp", "--experiments=use_runner_v2"],
    "flink": ["--runner=FlinkRunner", "--flink_master=localhost:8081", "--environment_type=LOOPBACK"],
    "spark": ["--runner=SparkRunner", "--spark_master_url=spark://localhost:7077",
              "--environment_type=LOOPBACK"],
}


class ScenesConfig(Section):
    engine: Literal["batched", "pyscenedetect"] = "batched"
    """Hard cuts: `pyscenedetect` feeds ContentDetector.process_frame; `batched` runs the same algorithm (and
    PySceneDetect's FlashFilter) with OpenCV primitives on our decode: same cuts, ~3x less per-frame cost."""
    detect_size: int = Field(16, ge=16)
    """Cut detection runs on frames downscaled by the smallest integer factor that brings their longer side to
    at most this; 16 (or less) uses the 16x16 thumbnails the job keeps anyway (cheapest, same F1 here)."""
    threshold: float = Field(15.0, gt=0)
    """PySceneDetect ContentDetector threshold for hard cuts (mean HSV change between frames)."""
    min_scene_len_s: float = Field(0.5, ge=0)
    """Shortest scene: cuts closer than this to the previous cut are merged (PySceneDetect min_scene_len)."""
    min_changed_fraction: float = Field(0.5, ge=0, le=1)
    """`batched` engine: a frame is a cut only if this share of its detection-frame cells (the 16x16 thumbnails
    by default) also changed by `threshold` or more (0 = plain ContentDetector). A cut changes most of the frame;
    a large object appearing on a still scene lifts the mean change as much but moves few cells (default corpus:
    cuts >= 0.66, such frames <= 0.38)."""
    gradual: bool = True
    """Also detect gradual transitions (dissolves, fades) with a twin-comparison detector."""
    gradual_reach_s: float = Field(0.5, gt=0)
    """Gradual detector compares frames this far before and after each frame (about half a dissolve)."""
    gradual_threshold: float = Field(15.0, gt=0)
    """Mean absolute change (0-255, 16x16 colour thumbnails) across the reach that marks a gradual transition."""
    gradual_min_changed_fraction: float = Field(0.5, ge=0, le=1)
    """A gradual transition must also change this share of the 16x16 thumbnail cells by `gradual_threshold` or
    more across the reach (0 = no such test). A dissolve or fade changes the whole frame; a large object
    appearing or moving lifts the mean change over few cells (default corpus: dissolves found 89.9% -> 99.9%,
    false transitions 746 -> 0 with 0.5)."""

    @model_validator(mode="after")
    def _gate_needs_batched(self) -> "ScenesConfig":
        if self.min_changed_fraction > 0 and self.engine != "batched":
            raise ValueError("min_changed_fraction needs engine: batched (PySceneDetect's own ContentDetector has "
                             "no such gate); set it to 0 with engine: pyscenedetect")
        return self


class QualityConfig(Section):
    min_resolution: int = Field(64, ge=1)
    """Videos whose shorter side is below this many pixels are dropped (`low_resolution`)."""
    max_edge_width: float = Field(3.5, gt=0)
    """Windows whose edges are wider than this many pixels (at `blur_size`) are dropped as `blurry`. The score is
    the 10th percentile over the window's scored frames of the median width (local range / slope) of each frame's
    steepest edges; it does not depend on contrast, so plain, low-contrast scenes stay sharp. Measured at 56 px:
    clean <= 2.3, re-encoded near-duplicates <= 3.0, Gaussian-blurred (sigma 6 at 112 px) >= 4.1."""
    blur_size: int = Field(56, ge=16)
    """Frames are scored for blur resized to blur_size x blur_size (the candidate frame is reused when it is that
    size: a square source at `frame_size`), so the edge-width threshold does not depend on the source resolution."""
    sample_fps: float = Field(1.0, gt=0)
    """Candidate frames per second of source time scored for blur (at most `candidate_fps`; brightness uses every
    candidate). Blur affects every frame, so a few per second suffice; this keeps scoring off the hot path."""
    min_brightness: float = Field(25.0, ge=0, le=255)
    """Median mean luma below this (and median highlight below `min_highlight`) -> dropped as `too_dark`."""
    min_highlight: float = Field(64.0, ge=0, le=255)
    """A dark window (median mean luma < `min_brightness`) is `too_dark` only if the median over its frames of
    the brightest luma is below this too: bright text on a black title card or credits is not underexposure
    (an underexposed video has no bright pixel: gain 0.12 keeps every luma <= 31)."""
    max_brightness: float = Field(235.0, ge=0, le=255)
    """Median mean luma above this -> dropped as `washed_out`."""
    min_frames: int = Field(3, ge=1)
    """Videos that decode to fewer frames are dropped whole as `too_short` (every query filtered): scene and
    gradual-transition detection compare frames a step apart and the frame sampler needs distinct frames."""
    min_duration_s: float = Field(0.1, ge=0)
    """Videos shorter than this (decoded frames / fps) are dropped whole as `too_short`: a ~0 s clip has no
    moment to ground."""


class DedupConfig(Section):
    num_perm: int = Field(128, ge=16)
    """MinHash permutations (datasketch)."""
    bands: int = Field(32, ge=1)
    """LSH bands; `num_perm` must be a multiple. More bands -> more candidates at lower Jaccard."""
    seed: int = 1
    """MinHash seed (fixed so band keys are stable across runs)."""
    hash_fps: float = Field(2.0, gt=0)
    """Frames per second of source time hashed for the video signature (robust to re-encodes and fps)."""
    lag: int = Field(2, ge=1)
    """A video shingle pairs a frame's code with the code this many samples later (order, not just content)."""
    projections: int = Field(16, ge=1)
    """Random projections per frame code (p-stable LSH of the coarse colour layout)."""
    bucket_width: float = Field(8.0, gt=0)
    """Quantization width of a projection: larger tolerates more re-encoding change, merges more."""
    video_jaccard: float = Field(0.5, gt=0, le=1)
    """Candidate video pairs with (exact) shingle Jaccard >= this are near-duplicates. On the plain-background
    default corpus re-encoded copies score 0.53-0.82 against their original (0.6 missed 5-7 of 30 copies, which
    then could land in another split) and no unrelated pair was merged at 0.5."""
    query_ngram: int = Field(2, ge=1)
    """Words per query shingle."""
    query_jaccard: float = Field(0.8, gt=0, le=1)
    """Queries on the same video with word-shingle Jaccard >= this and overlapping moments are duplicates."""

    @model_validator(mode="after")
    def _bands_divide(self) -> "DedupConfig":
        if self.num_perm % self.bands:
            raise ValueError(f"num_perm {self.num_perm} must be a multiple of bands {self.bands}")
        return self


class TextBiasConfig(Section):
    enabled: bool = True
    """Run the blind (text + duration only) predictor and drop queries it can answer."""
    folds: int = Field(5, ge=2)
    """Cross-fitting folds, assigned by a stable hash of the source video: no query scores itself."""
    iou_threshold: float = Field(0.5, gt=0, le=1)
    """Queries whose blind-predicted moment has IoU >= this with the truth are `text_answerable`."""
    min_count: int = Field(5, ge=1)
    """A word needs this many training occurrences before its position prior is trusted."""
    max_std: float = Field(0.08, gt=0)
    """A word's prior is trusted only if the std of its start and end is at most this fraction of the duration."""
    histogram_bins: int = Field(20, ge=2)
    """Bins of the location-bias histogram (normalized start/end)."""


AuditFlag = Literal["ambiguous", "far_from_scene_change", "no_change_at_boundary", "touches_video_end", "too_long"]
"""The annotation audit's flags (beam_jobs/audit.py has the rules); a query filtered for one has reason
`audit_<flag>`."""


class AuditConfig(Section):
    ambiguous_jaccard: float = Field(0.8, gt=0, le=1)
    """`ambiguous`: two queries of one video whose word-shingle Jaccard (`dedup.query_ngram`-word shingles, the
    query dedup's) is at least this have the same or near-same text."""
    ambiguous_iou: float = Field(0.5, gt=0, le=1)
    """... and are `ambiguous` when their moments' IoU is below this (at or above it they are duplicates,
    `dedup.query_jaccard`'s business): the text names more than one moment of the video."""
    boundary_tolerance_s: float = Field(0.5, ge=0)
    """`far_from_scene_change`: neither boundary within this of a detected scene change (cut or gradual
    transition; only in videos that have one). `no_change_at_boundary`: a boundary with neither a scene change nor
    a content change point within this."""
    change_min: float = Field(1.0, gt=0)
    """`no_change_at_boundary`'s content change points, from each frame's mean absolute thumbnail change from the
    previous one (0-255, 16x16 colour thumbnails of every decoded frame): a spike is a frame whose change is at
    least this, a step a frame where the median change after it differs from the one before it by at least this."""
    change_ratio: float = Field(2.0, ge=1)
    """... and a spike is at least this many times the median change before and after it (something appears or
    disappears), a step this factor between the two medians (motion starts or stops); steady motion is neither
    (precision and recall on planted imprecise windows: docs/stages.md, preprocess)."""
    change_context_s: float = Field(1.0, gt=0)
    """How far before and after a frame its medians reach."""
    end_margin_s: float = Field(0.1, ge=0)
    """`touches_video_end`: a moment starting within this of 0 or ending within this of the video's duration."""
    max_fraction: float = Field(0.8, gt=0, le=1)
    """`too_long`: a moment (first start to last end) longer than this fraction of its video."""
    filter: list[AuditFlag] = Field(default_factory=list)
    """Flags whose queries are filtered (reason `audit_<flag>`, the first flag of this list a query has); empty:
    the audit only counts (manifest.json `audit`) and lists (`audit.jsonl`), every decision and shard unchanged."""


class PreprocessConfig(Section):
    records: str = Field("data/interim/annotated_records.jsonl", json_schema_extra=NOT_OUTPUT)
    """Canonical records written by the annotate stage (ingest's records, less any withheld, plus accepted auto
    records; with `annotate.enabled` false, ingest's records as they are)."""
    out_dir: str = Field("data/shards", json_schema_extra=NOT_OUTPUT)
    """Shard root: `<out_dir>/<split>/shard-%06d.tar`, plus manifest.json and dead_letter.jsonl."""
    reader: Literal["opencv"] = "opencv"
    """Video reader (decoder) backend; each video is decoded once."""
    decode_threads: int = Field(1, ge=0, json_schema_extra=NOT_OUTPUT)
    """Decoder threads per video (0 = OpenCV's default: FFmpeg frame threads, one per CPU). 1 is fastest when
    the runner already runs a worker per core, and for small frames even in one process: per-video thread
    start-up and per-frame hand-offs cost more than they save (2.7x faster decode at 112 px, measured).
    Frames are the same either way."""
    max_window_s: float = Field(16.0, gt=0)
    """Longest window cut from one source video (cut at scene boundaries); 16 s keeps long videos' windows as
    dense in frames as the ordinary 8-16 s videos."""
    frame_mode: Literal["uniform", "adaptive", "family"] = "uniform"
    """Frame sampling: uniform in time, adaptive (same budget, denser where content changes), or `family`: the
    policy of `family`'s processor (uniform at its fps within its min/max frames, fewer while the window would
    pass `max_video_tokens`)."""
    family: str = QWEN3_VL.name
    """`frame_mode: family`: whose sampling policy and resize rule (a module of vtg/model/families/)."""
    max_video_tokens: int = Field(0, ge=0)
    """`frame_mode: family`: a window's video token budget under that family's resize rule (0: none beyond its
    pixel bounds; TimeLens evaluates with 14,336)."""
    num_frames: int = Field(16, ge=2)
    """Frames per window (the budget of both modes; ignored by `uniform` when `frame_fps` > 0)."""
    frame_fps: float = Field(0.0, ge=0)
    """Uniform mode at a fixed rate (frames per second) instead of a fixed count; 0 = fixed count."""
    adaptive_mix: float = Field(0.5, ge=0, le=1)
    """Adaptive mode: share of the frame budget spread uniformly; the rest follows content change."""
    candidate_fps: float = Field(4.0, gt=0)
    """Decoded frames kept (resized) per second as candidates for extraction; bounds memory per video."""
    frame_size: int = Field(56, ge=28)
    """Frames are stored at about frame_size^2 pixels with the source's aspect ratio (a square source: exactly
    frame_size x frame_size); each model family's processor then resizes them to its patch multiples."""
    jpeg_quality: int = Field(90, ge=1, le=100)
    """JPEG quality of stored frames."""
    scenes: ScenesConfig = ScenesConfig()
    """Scene cut detection."""
    quality: QualityConfig = QualityConfig()
    """Quality filter thresholds."""
    dedup: DedupConfig = DedupConfig()
    """MinHash near-duplicate removal (videos and queries)."""
    text_bias: TextBiasConfig = TextBiasConfig()
    """Blind text-bias filter."""
    audit: AuditConfig = AuditConfig()
    """Annotation audit: ambiguous queries, boundaries away from any visual change, moments touching the video's
    ends or spanning most of it (counted and listed; filtered only for the flags in `filter`)."""
    split_fractions: dict[str, float] = Field(default_factory=lambda: {"train": 0.6, "val": 0.2, "test": 0.2})
    """Fractions of source videos (or duplicate clusters) per split, by a stable hash."""
    allowed_licences: list[str] = Field(default_factory=list)
    """Licences a record's source may have to reach a shard (SPDX ids or `LicenseRef-<name>`, as declared in
    `ingest.sources`); any other is filtered `licence_not_allowed`, with its source and licence. Empty: all."""
    samples_per_shard: int = Field(500, ge=1)
    """Maximum samples per tar shard."""
    runner: Literal["direct", "dataflow", "flink", "spark"] = Field("direct", json_schema_extra=NOT_OUTPUT)
    """Beam runner profile: selects `runner_profiles.<runner>` (CLI pipeline options win over it)."""
    runner_profiles: dict[str, list[str]] = Field(RUNNER_PROFILES, json_schema_extra=NOT_OUTPUT)
    """Beam pipeline options per runner profile (edit project/bucket/master for your cluster)."""
    direct_num_workers: int = Field(2, ge=1, json_schema_extra=NOT_OUTPUT)
    """DirectRunner worker processes (multi_processing mode)."""
    progress: bool = Field(True, json_schema_extra=NOT_OUTPUT)
    """Show a progress bar (videos processed) on local runners."""

    @model_validator(mode="after")
    def _family_known(self) -> "PreprocessConfig":
        from vtg.model.families import FAMILIES

        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not a model family here (known: {', '.join(FAMILIES)})")
        return self

    @field_validator("allowed_licences")
    @classmethod
    def _licences_known(cls, v: list[str]) -> list[str]:
        from vtg.sources import check_licence

        return [check_licence(x) for x in v]

    @model_validator(mode="after")
    def _splits_valid(self) -> "PreprocessConfig":
        fr = self.split_fractions
        if not fr or any(v < 0 for v in fr.values()):
            raise ValueError(f"split_fractions {fr} must be non-negative")
        missing = [s for s in ("train", "val", "test") if fr.get(s, 0) <= 0]
        if missing:
            raise ValueError(f"split_fractions {fr} give no share to {', '.join(missing)}: training reads train, "
                             "selection val, the held-out score test; give each a share > 0")
        if abs(sum(fr.values()) - 1.0) > 1e-6:
            raise ValueError(f"split_fractions {fr} sum to {sum(fr.values()):g}, not 1: give every split's share "
                             "(an override replaces the whole mapping)")
        return self
