"""`benchmark`: the benchmark protocol (`python -m evaluation.benchmark`): whole source videos, standard formats."""

from typing import Literal

from pydantic import Field

from vtg.config._base import NOT_OUTPUT, Section


class BenchmarkConfig(Section):
    records: str = "data/benchmark/records.jsonl"
    """Canonical records of the benchmark's queries: `python -m ingest ingest.annotations=[<Charades-STA .txt,
    ActivityNet .json, QVHighlights .jsonl>] ingest.video_root=<its videos> ingest.out=<this file>` writes them."""
    profile: Literal["full_video", "lmms_eval_charades", "lmms_eval_timelens", "timelens", "timelens2"] = "full_video"
    """`full_video`: the whole video, frames by the model family's sampling policy (2 fps within its frame bounds)
    under `max_frames`/`max_video_tokens`, the model's own prompt and answer parser. Other harnesses as data
    (evaluation/profiles/), each with its own card: `lmms_eval_charades` and `lmms_eval_timelens` (lmms-eval 0.7.3's
    Charades-STA and TimeLens-Bench tasks: 32 uniform frames, their prompts and parsers, an answer without a time
    pair scores 0, their metric names in percent); `timelens` (TimeLens's budget: 2 fps, 64 to 14,336 video tokens
    of 28x28 px through qwen-vl-utils 0.0.14); `timelens2` (TimeLens2's: 4 fps up to 2,048 frames, 32x32 to 640x640
    px a frame, 128,000 x 32 x 32 px per video). `python -m evaluation.benchmark --profiles a,b` scores several."""
    max_frames: int = Field(0, ge=0)
    """`full_video`: at most this many frames per video (0: the family's own maximum)."""
    max_video_tokens: int = Field(0, ge=0)
    """`full_video`: fewer frames while a video would pass this many video tokens (0: none; TimeLens evaluates
    with 14,336)."""
    max_new_tokens: int = Field(32, ge=1)
    """`full_video`: generated tokens per answer (profiles from another harness bring their own)."""
    max_examples: int = Field(0, ge=0)
    """Score only the first N records (0: all)."""
    batch_size: int = Field(4, ge=1, json_schema_extra=NOT_OUTPUT)
    """Videos per generation batch."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", json_schema_extra=NOT_OUTPUT)
    """`auto` (cuda when available), `cpu`, `cuda` or `cuda:<i>`."""
    out_dir: str = Field("reports/benchmark", json_schema_extra=NOT_OUTPUT)
    """metrics.json (with its harness card and intervals), predictions.jsonl and summary.md per checkpoint and
    profile: `<out_dir>/<checkpoint>-<profile>-<records stem>-<key>/` (key: the records' and the checkpoint's
    content, so no run overwrites another's)."""
