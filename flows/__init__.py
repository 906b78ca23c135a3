"""Prefect flows that chain the stages; also the `python -m flows` entry of `make run`."""
