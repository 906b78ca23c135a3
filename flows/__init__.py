"""Prefect flows that chain the stages; also the `python -m flows` entry of `make run`.

- `flows.pipeline.post_training`: the whole pipeline (flow `post-training`).
- `flows.evaluation.evaluate_checkpoint`: one checkpoint (flow `evaluate-checkpoint`, event-triggered when served).
- `flows.events.on_checkpoint_saved`: the checkpoint hook training calls (`train.checkpoint_hooks`).
- `python -m flows.serve`: Prefect server + MLflow server + served deployments (`make serve`).
- `python -m flows.lineage`: walk the lineage chain of a model version, eval run or checkpoint.
"""

import logging

logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prefect API call otherwise
