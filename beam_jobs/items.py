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
