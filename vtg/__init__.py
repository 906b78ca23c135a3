"""Shared core of the video temporal grounding post-training pipeline.

Holds what every stage agrees on: typed configuration, the canonical record, the answer format,
the synthetic corpus and annotation ingest. Stage packages (`beam_jobs`, `training`, `evaluation`,
`flows`) import from here, never from each other's internals.
"""

__version__ = "0.1.0"
