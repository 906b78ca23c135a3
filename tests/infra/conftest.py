"""infra/ is not an installed package: make `import infra` work however pytest is started."""

import infra_paths  # noqa: F401  (puts the repo root on sys.path)
