"""The path past one machine: work pools, deployments, multi-node launch, service smoke checks.

The configuration files (compose, images, prefect.yaml, k8s, hostfile template) live beside this package;
see docs/scaling.md.
"""
