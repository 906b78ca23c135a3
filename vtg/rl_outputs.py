"""The RL stage's report files: the one home of their names (inside `rl.report_dir`, default `reports/rl/`).

`steps.csv`: one row per RL step (step, then `training.rl.grpo.STEP_METRICS`; an empty cell where a metric was not
measured, e.g. KL between `rl.kl_every` steps). `summary.json`: the run's start checkpoint, the difficulty
filter's counts, first/last-10-step means. DVC tracks both (dvc.yaml `rl` stage); the evaluation report draws
the reward/KL/entropy curves from `steps.csv`.
"""

STEPS_CSV = "steps.csv"
SUMMARY_JSON = "summary.json"
