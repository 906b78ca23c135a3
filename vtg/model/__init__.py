"""The VLM both training and evaluation use: loading (hub id, local path or `tiny`), the tiny builder, and the
processing that turns a shard sample into model inputs (vision patches, chat prompt, answer target).

Evaluation imports these, never `training.*`: the model contract is shared, the training loop is not.
"""
