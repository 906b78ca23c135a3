"""`preprocess`: the Beam job that turns canonical records + videos into WebDataset shards."""

from typing import Literal

from pydantic import Field

from vtg.config._base import Section


class PreprocessConfig(Section):
    records: str = "data/interim/records.jsonl"
    """Canonical records written by ingest."""
    out_dir: str = "data/shards"
    """Shard root: `<out_dir>/<split>/shard-%06d.tar`, plus manifest.json and dead_letter.jsonl."""
    max_window_s: float = Field(30.0, gt=0)
    """Longest window cut from one source video (cut at scene boundaries)."""
    frame_mode: Literal["uniform", "adaptive"] = "uniform"
    """Frame sampling: uniform in time, or adaptive (same budget, denser where content changes)."""
    num_frames: int = Field(16, ge=2)
    """Frames per window."""
    frame_size: int = Field(56, ge=28)
    """Frames are resized to frame_size x frame_size (a multiple of 28 for Qwen2.5-VL)."""
    split_fractions: dict[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}
    """Fractions of source videos (or duplicate clusters) per split, by a stable hash."""
    samples_per_shard: int = Field(500, ge=1)
    """Maximum samples per tar shard."""
    runner: Literal["direct", "dataflow", "flink", "spark"] = "direct"
    """Beam runner profile; the profile's pipeline options come from `runner_options`."""
    direct_num_workers: int = Field(2, ge=1)
    """DirectRunner worker processes (multi_processing mode)."""
