"""`corpus`: the deterministic synthetic grounding corpus (the embedded default data set)."""

from typing import Literal

from pydantic import Field

from vtg.config._base import Section


class CorpusConfig(Section):
    out_dir: str = "data/raw/synthetic"
    """Where the videos, annotations and ground-truth file are written."""
    seed: int = 0
    """Seed for everything random in the corpus: same seed -> byte-identical files."""
    n_videos: int = Field(120, ge=1)
    """Clean videos at scale 1 (defects and near-duplicates are added on top)."""
    scale: float = Field(1.0, gt=0)
    """Multiplies the number of videos (benchmarks use larger scales)."""
    fps: float = Field(8.0, gt=0, le=60)
    """Frame rate of the written mp4 files."""
    width: int = Field(112, ge=16)
    """Frame width of clean videos."""
    height: int = Field(112, ge=16)
    """Frame height of clean videos."""
    min_duration_s: float = Field(10.0, gt=0)
    """Shortest clean video."""
    max_duration_s: float = Field(30.0, gt=0)
    """Longest clean video."""
    annotation_format: Literal["charades", "qvhighlights", "activitynet", "jsonl"] = "qvhighlights"
    """Which real annotation format the corpus writes (ingest reads it like real data)."""
    defect_fraction: float = Field(0.1, ge=0, le=0.5)
    """Fraction of extra videos with injected defects (blur, dark, low-res, corrupt, duplicates...)."""
