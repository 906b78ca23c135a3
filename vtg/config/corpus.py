"""`corpus`: the deterministic synthetic grounding corpus (the embedded default data set)."""

from typing import Literal

from pydantic import Field, model_validator

from vtg.config._base import NOT_OUTPUT, Section


class CorpusConfig(Section):
    out_dir: str = Field("data/raw/synthetic", json_schema_extra=NOT_OUTPUT)
    """Where `videos/`, `annotations/` and `ground_truth.json` are written (built aside, then renamed in)."""
    seed: int = 0
    """Seed for everything random in the corpus: same seed -> byte-identical files."""
    n_videos: int = Field(2000, ge=1)
    """Clean videos at scale 1 (defective videos and near-duplicates are added on top)."""
    scale: float = Field(1.0, gt=0)
    """Multiplies the number of videos (benchmarks use larger scales)."""
    fps: float = Field(8.0, gt=0, le=60)
    """Frame rate of the written mp4 files."""
    width: int = Field(112, ge=32)
    """Frame width of clean videos."""
    height: int = Field(112, ge=32)
    """Frame height of clean videos."""
    min_duration_s: float = Field(8.0, ge=6)
    """Shortest clean video."""
    max_duration_s: float = Field(16.0, ge=6)
    """Longest ordinary clean video."""
    long_fraction: float = Field(0.1, ge=0, le=1)
    """Fraction of clean videos that are long (exercise windowing at `preprocess.max_window_s`)."""
    long_min_duration_s: float = Field(40.0, ge=6)
    """Shortest long video."""
    long_max_duration_s: float = Field(70.0, ge=6)
    """Longest long video (their events stay inside one scene)."""
    min_event_s: float = Field(2.5, gt=0)
    """Shortest visual event (the queried object is visible/moving only during the event)."""
    max_event_s: float = Field(6.0, gt=0)
    """Longest visual event."""
    min_texture_contrast: int = Field(4, ge=0, le=100)
    """Smallest luma contrast between the two tones of a scene's background texture (lower: plainer scenes)."""
    max_texture_contrast: int = Field(9, ge=1, le=101)
    """Upper bound (exclusive) of the background texture contrast."""
    min_object_radius: float = Field(0.18, gt=0, le=0.3)
    """Smallest radius of an event's object, as a fraction of the frame side."""
    max_object_radius: float = Field(0.24, gt=0, le=0.3)
    """Largest radius of an event's object (and of distractors), as a fraction of the frame side."""
    max_events: int = Field(1, ge=1, le=6)
    """Most events (queries) per ordinary video; long videos get one more."""
    distractor_fraction: float = Field(0.25, ge=0, le=1)
    """Fraction of clean videos with a moving distractor object (a colour no query names) besides the events."""
    dissolve_fraction: float = Field(0.6, ge=0, le=1)
    """Fraction of videos with at least one ~1 s dissolve (gradual transition) besides their hard cuts."""
    text_answerable_fraction: float = Field(0.08, ge=0, le=0.5)
    """Fraction of videos with an opening title card and, separately, with closing credits (text-answerable queries)."""
    duplicate_query_fraction: float = Field(0.05, ge=0, le=1)
    """Fraction of clean videos with one query repeated (same or near-same text, same moment)."""
    ambiguous_query_fraction: float = Field(0.0, ge=0, le=1)
    """Fraction of clean videos where a queried object does its action a second time, later or earlier in a free
    span, annotated with the same or near-same text (`ambiguous_query`: the query is not unique in its video)."""
    imprecise_fraction: float = Field(0.0, ge=0, le=1)
    """Fraction of clean videos where one query's annotated window is shifted, widened or narrowed by 1-2.5 s per
    moved boundary away from the true event (ground truth keeps both windows)."""
    annotation_format: Literal["charades", "qvhighlights", "activitynet", "jsonl"] = "qvhighlights"
    """Which real annotation format the corpus writes (ingest reads it like real data)."""
    defect_fraction: float = Field(0.1, ge=0, le=0.5)
    """Extra defective videos as a fraction of clean ones (at least one of each defect kind when > 0)."""
    invalid_per_100: float = Field(1.0, ge=0)
    """Invalid annotation lines of each kind per 100 clean videos (at least one of each kind when > 0)."""
    workers: int = Field(2, ge=0, json_schema_extra=NOT_OUTPUT)
    """Worker processes that render videos (0 = one per CPU); output does not depend on it."""

    @model_validator(mode="after")
    def _ranges(self) -> "CorpusConfig":
        if self.min_duration_s > self.max_duration_s:
            raise ValueError(f"min_duration_s {self.min_duration_s} > max_duration_s {self.max_duration_s}")
        if self.long_min_duration_s > self.long_max_duration_s:
            raise ValueError(f"long_min_duration_s {self.long_min_duration_s} > long_max_duration_s")
        if self.min_event_s > self.max_event_s:
            raise ValueError(f"min_event_s {self.min_event_s} > max_event_s {self.max_event_s}")
        if self.min_texture_contrast >= self.max_texture_contrast:
            raise ValueError(f"min_texture_contrast {self.min_texture_contrast} must be below max_texture_contrast")
        if self.min_object_radius > self.max_object_radius:
            raise ValueError(f"min_object_radius {self.min_object_radius} > max_object_radius {self.max_object_radius}")
        if self.max_event_s >= self.min_duration_s:
            raise ValueError(f"max_event_s {self.max_event_s} must be below min_duration_s {self.min_duration_s}")
        return self
