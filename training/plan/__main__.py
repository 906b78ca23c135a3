"""`python -m training.plan`: the planner's command line (`training.plan` holds the arithmetic; the experiment's
activations come from `training.preflight`)."""


from __future__ import annotations

import argparse
import sys

from training.plan import GB, ActivationNeed, Setup, model_size, render


def activation_need(cfg) -> tuple[ActivationNeed, object] | None:
    """The experiment's activations per GPU and its pre-flight report, or None when nothing here knows its
    architecture (then the planner falls back to --min-activation-gb's default)."""
    from training.preflight import UnknownArchitecture, preflight

    try:
        report = preflight(cfg)
    except UnknownArchitecture:
        return None
    c = report.configured
    return ActivationNeed(c.activations.total_b / GB, report.micro_batch, report.tokens.total, report.token_budget,
                          report.packing, c.gradient_checkpointing), report


DEFAULT_MIN_ACTIVATION_GB = 8.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="With an experiment (or params.yaml) whose architecture is known, the size, trainable share and the "
               "activations the recommendation must leave come from training.preflight's count of its longest "
               "micro-batch (train.micro_batch_size, or fewer under train.data.token_budget). Overrides are dotted "
               "keys, e.g. train.data.token_budget=8192 train.model.gradient_checkpointing=true.")
    parser.add_argument("--params", type=float, help="total parameters (e.g. 7e9); default: from the config")
    parser.add_argument("--largest-layer", type=float, help="parameters of the largest layer (ZeRO-3 buffer)")
    parser.add_argument("--gpus", type=int, help="GPUs per node (default: train.num_gpus)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default: %(default)s)")
    parser.add_argument("--gpu-mem", type=float, default=None, help="GiB per GPU (default: train.gpu_mem_gb)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="default: engine.precision")
    parser.add_argument("--trainable-frac", type=float,
                        help="fraction of parameters trained (default: counted from the architecture and "
                             "train.model.finetune; without one, 1, or 0.01 for finetune=lora/qlora)")
    parser.add_argument("--min-activation-gb", type=float, default=None,
                        help="activation memory a recommendation must leave per GPU (default: the experiment's "
                             f"micro-batch as the pre-flight counts it; {DEFAULT_MIN_ACTIVATION_GB:g} when its "
                             "architecture is unknown or --params plans another size)")
    parser.add_argument("--params-file", dest="params_file", default="params.yaml", help="config params file")
    parser.add_argument("--experiment", "-e", default=None, help="experiment whose train section to plan")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    args = parser.parse_args(argv)
    from vtg.config import load_config

    cfg = load_config(args.params_file, args.experiment, args.overrides)
    tcfg = cfg.train
    found = None if args.params or (args.min_activation_gb is not None and args.trainable_frac is not None) \
        else activation_need(cfg)
    need, report = found if found else (None, None)
    if args.params:
        total, largest = args.params, args.largest_layer or 0.05 * args.params
    elif report is not None:
        total, largest = report.params, args.largest_layer or model_size(tcfg.model.base)[1]
    else:
        total, largest = model_size(tcfg.model.base)
        largest = args.largest_layer or largest
    if args.trainable_frac is not None:
        frac = args.trainable_frac
    elif report is not None:
        frac = report.trainable / report.params
    else:
        frac = 0.01 if tcfg.model.finetune in ("lora", "qlora") else 1.0
    quantized, tensors = 0.0, 0
    if tcfg.model.finetune == "qlora":
        # the architecture's own count; for a size given by hand, all but the embedding and the LM head
        quantized, tensors = ((report.quantized, report.quantized_tensors) if report is not None and not args.params
                              else (max(0.0, total - 2 * largest), 0))
    setup = Setup(params=total, largest_layer=largest, gpus_per_node=args.gpus or tcfg.num_gpus, nodes=args.nodes,
                  gpu_mem_gb=args.gpu_mem or tcfg.gpu_mem_gb, precision=args.precision or cfg.engine.precision,
                  trainable_frac=frac, quantized=quantized, quantized_tensors=tensors)
    if args.min_activation_gb is not None:
        need_gb, need = args.min_activation_gb, None
    else:
        need_gb = need.gb if need is not None else DEFAULT_MIN_ACTIVATION_GB
    print(render(setup, need_gb, need))
    return 0


if __name__ == "__main__":
    from vtg.cli_common import run_cli

    sys.exit(run_cli(main))
