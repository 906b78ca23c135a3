"""Automatic annotation: the third data source of seed 000 ("copyright-checked video sources, existing annotation
datasets, automatic annotation generation"). `python -m annotate`; the stage logic is `annotate.run`."""

from annotate.run import run

__all__ = ["run"]
