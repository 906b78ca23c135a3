"""Beam pipeline options: the runner profile from params, then any option given on the command line."""

from __future__ import annotations

from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from vtg.config import PipelineConfig
from vtg.errors import ConfigError


def option_args(cfg: PipelineConfig, extra_argv: Sequence[str] = ()) -> list[str]:
    """Profile options (`preprocess.runner_profiles[preprocess.runner]`), DirectRunner worker count, then the
    pass-through argv (argparse keeps the last occurrence, so the command line wins)."""
    pp = cfg.preprocess
    if pp.runner not in pp.runner_profiles:
        raise ConfigError(f"preprocess.runner={pp.runner!r} has no entry in preprocess.runner_profiles "
                          f"(known: {', '.join(sorted(pp.runner_profiles))})")
    args = list(pp.runner_profiles[pp.runner])
    if pp.runner == "direct":
        args.append(f"--direct_num_workers={pp.direct_num_workers}")
    return args + list(extra_argv)


def pipeline_options(cfg: PipelineConfig, extra_argv: Sequence[str] = ()) -> PipelineOptions:
    args = option_args(cfg, extra_argv)
    bad = [a for a in args if not a.startswith("--")]
    if bad:
        raise ConfigError(f"pipeline options must look like --name=value, got {bad}")
    return PipelineOptions(args)
