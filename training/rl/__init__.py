"""GRPO post-training after SFT with a temporal-IoU reward: `python -m training.rl` (see `training.rl.grpo`)."""
