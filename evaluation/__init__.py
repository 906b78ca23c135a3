"""Per-checkpoint evaluation: parse answers, score mIoU and R@1, blind baselines, report, registry."""
