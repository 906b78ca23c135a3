"""Speed benchmarks, one module per measured claim, each against baselines measured in the same run.

Run from the repository root as `python -m benchmarks.<name>` (`make bench` runs them all; a module run by path,
`python benchmarks/<name>.py`, would put this folder first on `sys.path`). No module here is named after a top-level
package (`corpus`, `training`, ...), so none can shadow one. Each writes its ratios and figures, with date, commit and
load average, to `reports/bench/<name>.json` (`--json` elsewhere): `benchmarks.figures`.
"""
