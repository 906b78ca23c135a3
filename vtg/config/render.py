"""`params.yaml`, written from the config classes: their defaults are the values, their docstrings the comments.

The classes are the one place where a default and its documentation live; `python -m vtg.config --write-params`
regenerates params.yaml from them and tests/test_config.py fails when the file in the repo is stale.

Layout: the header comment, then one block per top-level section (separated by a blank line). A leaf field is
`key: value  # docstring` with the value in YAML flow style (`[0.3, 0.5, 0.7]`, `{test: 0.1, train: 0.8, val: 0.1}`,
strings quoted where a flow collection would need it, e.g. `'sqlite:///mlflow.db'`); a nested section is
`key:  # docstring` followed by its fields, indented two more spaces. A mapping of lists (e.g.
`preprocess.runner_profiles`) is written one entry per line, a list of mappings (`ingest.sources`) one `- {...}`
item per line. Multi-line docstrings become one-line comments.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

HEADER = (
    "# Every stage's knobs, one section per stage. Experiments (experiments/*.yaml) override these;\n"
    "# dotted command-line overrides (train.lr=5e-5) win last. `python -m vtg.config` prints the result.\n"
)
INDENT = "  "


def _comment(doc: str | None) -> str:
    return " ".join(line.strip() for line in (doc or "").splitlines() if line.strip())


def _flow(value: Any) -> str:
    """One value in YAML flow style, quoted as it would be inside a flow collection (`[a: b]` needs quotes)."""
    text = yaml.safe_dump([value], default_flow_style=True, width=float("inf"), allow_unicode=True).strip()
    if not (text.startswith("[") and text.endswith("]")):  # pragma: no cover - safe_dump of a list is a flow list
        raise ValueError(f"cannot render {value!r} on one line")
    return text[1:-1]


def _line(indent: int, key: str, value: str | None, doc: str | None) -> str:
    text = f"{INDENT * indent}{key}:" + (f" {value}" if value is not None else "")
    comment = _comment(doc)
    return f"{text}  # {comment}" if comment else text


def _section_lines(section: BaseModel, indent: int) -> list[str]:
    lines: list[str] = []
    fields = type(section).model_fields
    data = section.model_dump(mode="json")
    for name, field in fields.items():
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            lines.append(_line(indent, name, None, field.description))
            lines.extend(_section_lines(value, indent + 1))
        elif isinstance(data[name], list) and data[name] and all(isinstance(v, dict) for v in data[name]):
            lines.append(_line(indent, name, None, field.description))
            lines.extend(f"{INDENT * (indent + 1)}- {_flow(v)}" for v in data[name])
        elif isinstance(data[name], dict) and any(isinstance(v, (dict, list)) for v in data[name].values()):
            lines.append(_line(indent, name, None, field.description))
            lines.extend(f"{INDENT * (indent + 1)}{k}: {_flow(v)}" for k, v in data[name].items())
        else:
            lines.append(_line(indent, name, _flow(data[name]), field.description))
    return lines


def render_params(cfg: BaseModel | None = None) -> str:
    """The text of params.yaml for `cfg` (default: `PipelineConfig()`, i.e. the class defaults)."""
    if cfg is None:
        from vtg.config import PipelineConfig

        cfg = PipelineConfig()
    blocks = ["\n".join([f"{name}:", *_section_lines(getattr(cfg, name), 1)]) for name in type(cfg).model_fields]
    return HEADER + "\n\n".join(blocks) + "\n"
