"""Plain records passed between the pipeline's steps (picklable, no behaviour)."""

from __future__ import annotations

from dataclasses import dataclass, field

KEPT, FILTERED, FAILED = "kept", "filtered", "failed"


@dataclass(frozen=True)
class Outcome:
    """Where one input record ended: kept (reason = split), filtered (reason) or failed (reason = stage)."""

    annotation_id: str
    video_id: str
    status: str
    reason: str
    span: tuple[int, int] | None = None
    """Normalized moment (micro-units) for the location-bias histogram; None for unparsable lines."""
    detail: str = ""
    """Why, for a filtered record: the duplicate's canonical id, the blind IoU, the quality scores."""


@dataclass
class QueryItem:
    annotation_id: str
    text: str
    windows: list[tuple[float, float]]
    """Re-based to the window."""
    span: tuple[int, int]
    annotation_file: str = ""
    """`<format>:<path under its source's root>` (the record's)."""
    source: str = ""
    licence: str = ""
    """The record's source id and licence (one video's queries may come from several sources)."""


@dataclass
class WindowItem:
    video_id: str
    index: int
    start_s: float
    end_s: float
    timestamps: list[float]
    fps: float
    jpegs: list[bytes] = field(repr=False)
    quality: dict[str, float]
    scene_cuts: list[float]
    """Scene boundaries inside the window, relative to its start."""
    queries: list[QueryItem]
    source: str
    licence: str = ""
    video_path: str = ""
    """The source file (for dead letters; not stored in the sample)."""
    source_fps: float | None = None
    frame_indices: list[int] | None = None
    """Source frame index of each frame (shard contract 2)."""

    @property
    def key(self) -> str:
        return f"{self.video_id}.{self.index:04d}"


@dataclass
class VideoSig:
    """What near-duplicate detection needs from one decoded video."""

    video_id: str
    shingles: list[int]
    rank: tuple
    """Canonical preference: smaller is better (more usable windows, longer, sharper, then id)."""


@dataclass(frozen=True, order=True)
class StepError:
    """An exception one element raised in a step after its video was processed (near-duplicate detection, text
    bias, assembly): carried to assembly as that element's verdict, where its records become `processing_error`
    dead letters (a failed step never takes the job down, and never silently drops a record)."""

    stage: str
    error_type: str
    message: str

    @classmethod
    def of(cls, stage: str, e: BaseException) -> StepError:
        return cls(stage, type(e).__name__, str(e))

    @property
    def error(self) -> str:
        return f"{self.error_type}: {self.message}"


def pick(values, default=None):
    """The one verdict of an element from a join: a StepError if any step failed for it, else the value."""
    values = list(values)
    errors = sorted(v for v in values if isinstance(v, StepError))
    return errors[0] if errors else (values[0] if values else default)


@dataclass(frozen=True)
class AuditRow:
    """The annotation audit's verdict on one query that reached a split (`beam_jobs.audit`)."""

    annotation_id: str
    video_id: str
    split: str
    flags: dict | None
    """{flag: detail} (empty: nothing doubtful); None when the audit raised for the video."""
    filtered: str | None = None
    """`audit_<flag>` when `preprocess.audit.filter` filtered it."""
