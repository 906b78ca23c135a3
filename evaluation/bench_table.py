"""One table of a checkpoint scored under several benchmark profiles (`python -m evaluation.benchmark --profiles
a,b,c`): a row per profile with its metrics, their intervals, its card digest and its budget in words, as
markdown and json beside the profiles' own outputs. The rows are never ranked: each profile's card differs
(`vtg.harness.require_comparable` refuses), and the table says so."""

from __future__ import annotations

import hashlib
from pathlib import Path

from evaluation import intervals
from vtg.config import PipelineConfig
from vtg.io import write_json_atomic
from vtg.spans import metric_name

TABLE_JSON, TABLE_MD = "table.json", "table.md"
METRICS = ("miou", *(metric_name(t) for t in (0.3, 0.5, 0.7)))


def table_rows(results: list[dict]) -> list[dict]:
    """One row per profile: what it scored, how (card digest, budget, source, lmms-eval version), and where its
    own outputs are."""
    rows = []
    for r in results:
        s, card = r["summary"], r["summary"]["harness"]
        rows.append({"profile": r["profile"], "queries": s["counts"]["scored"],
                     "video_errors": s["counts"]["video_errors"],
                     "metrics": {m: s["model"][m] for m in METRICS},
                     "intervals": {m: s["intervals"]["model"].get(m) for m in METRICS},
                     "parse_failure_rate": s["model"]["parse_failure_rate"],
                     "as_reported": r.get("as_reported"), "card_digest": r["harness_digest"],
                     "budget": r["budget"], "lmms_eval_version": card["profile"]["lmms_eval_version"],
                     "source": (card["profile"].get("source") or {}).get("repository", "this project"),
                     "caveats": r.get("caveats", []), "out_dir": r["out_dir"]})
    return rows


def table_markdown(results: list[dict]) -> str:
    first = results[0]
    names = list(METRICS)
    lines = [f"## {first['checkpoint']} on {first['split']} under {len(results)} profiles", "",
             ("Each row was measured under its own harness card: compare a row only with a number published under "
              "the same protocol, never with another row."), "",
             "| profile | " + " | ".join(f"{n} [95% CI]" for n in names) + " | no span | card | budget |",
             "|" + " --- |" * (len(names) + 4)]
    for row in table_rows(results):
        cells = [intervals.format_ci(row["metrics"][m], row["intervals"][m]) for m in METRICS]
        lines.append(f"| `{row['profile']}` | " + " | ".join([*cells, f"{row['parse_failure_rate']:.1%}"])
                     + f" | {row['card_digest']} | {row['budget']} |")
    lines += ["", "Sources and lmms-eval versions:", ""]
    lines += [f"- `{row['profile']}`: {row['source']}"
              + (f" (lmms-eval {row['lmms_eval_version']})" if row["lmms_eval_version"] else "")
              + (f"; {len(row['caveats'])} caveats in its summary.md" if row["caveats"] else "")
              for row in table_rows(results)]
    return "\n".join(lines) + "\n"


def table_dir(results: list[dict], cfg: PipelineConfig) -> Path:
    """`<out_dir>/<checkpoint>-profiles-<records stem>-<key>`, keyed by the records, the checkpoint and the
    profiles, so another set of profiles never overwrites this table."""
    inputs = results[0]["inputs"]
    names = ",".join(r["profile"] for r in results)
    key = hashlib.sha256(f"{inputs['records_digest']}:{inputs['checkpoint_meta_digest']}:{names}"
                         .encode()).hexdigest()[:8]
    label = results[0]["checkpoint"].replace("/", "-")
    return Path(cfg.benchmark.out_dir) / f"{label}-profiles-{Path(inputs['records']).stem}-{key}"


def write_table(results: list[dict], cfg: PipelineConfig) -> Path:
    out = table_dir(results, cfg)
    out.mkdir(parents=True, exist_ok=True)
    first = results[0]
    (out / TABLE_MD).write_text(table_markdown(results))
    write_json_atomic(out / TABLE_JSON, {"checkpoint": first["checkpoint"], "split": first["split"],
                                         "inputs": first["inputs"], "rows": table_rows(results)})
    for r in results:
        r["table_dir"] = str(out)
    return out
