"""Issue 21 case 8 (input hygiene): a 20,000-character query passed pre-flight ("longest example 191 tokens"),
then stopped training before step 1 when it was among the first examples, and was trained on when it was not.
Length is now checked where the data enters: ingest dead-letters a query longer than `ingest.max_query_tokens`
(`query_too_long`), counted with the tokenizer pre-flight counts the model with (`vtg.model.tokens`), and
pre-flight budgets a query of exactly that many tokens, so no query that enters can make an example too long."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.declared import declared_arg

from ingest import reasons as R
from ingest.validate import Invalid, QueryLimit
from vtg.config import load_config
from vtg.model.text import query_ids
from vtg.model.tokens import counting_tokenizer
from vtg.records import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TEXT = "the person in the red shirt walks slowly across the kitchen and picks up a small blue cup "


def test_ingest_dead_letters_a_query_longer_than_the_limit_and_keeps_the_rest(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "v.mp4").write_bytes(b"")  # ingest only locates it: the annotation gives the duration
    rows = [("ok", "a person opens a door"), ("huge", "x" * 20_000), ("long", TEXT * 20)]
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps({"annotation_id": a, "video_id": "v", "query": q, "windows": [[0.5, 1.5]],
                                       "duration_s": 5.0}) + "\n" for a, q in rows))
    out = tmp_path / "out"
    # ingest counts with the tiny model's tokenizer without building the model: no torch import, no model in the
    # (empty) tiny cache afterwards (issue 40: ingest was 12 s of imports and a model build for 1 s of work)
    run_ingest = ("import atexit, runpy, sys; atexit.register(lambda: print('TORCH', 'torch' in sys.modules, "
                  "file=sys.stderr)); sys.argv[0] = 'ingest'; runpy.run_module('ingest', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", run_ingest, "--params", str(REPO / "params.yaml"),
                        declared_arg(tmp_path), f"ingest.annotations=[{ann}]", f"ingest.video_root={videos}",
                        f"ingest.out={out / 'r.jsonl'}",
                        f"ingest.dead_letter={out / 'd.jsonl'}", f"ingest.summary={out / 's.json'}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                            "VTG_TINY_CACHE": str(tmp_path / "tiny_cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TORCH False" in r.stderr and not list((tmp_path / "tiny_cache").glob("*/model.safetensors"))
    assert [x["annotation_id"] for x in read_jsonl(out / "r.jsonl")] == ["ok"]
    dead = {d["annotation_id"]: d for d in read_jsonl(out / "d.jsonl")}
    assert {k: d["reason"] for k, d in dead.items()} == {"huge": R.QUERY_TOO_LONG, "long": R.QUERY_TOO_LONG}
    assert "ingest.max_query_tokens=150" in dead["huge"]["detail"] and dead["huge"]["query_tokens"] > 150
    assert json.loads((out / "s.json").read_text())["by_reason"] == {R.QUERY_TOO_LONG: 2}


@pytest.mark.parametrize("experiment", [None, "qwen25vl_3b_lora_1gpu"])
def test_the_longest_query_ingest_lets_in_is_the_one_preflight_budgets(experiment):
    from training.preflight import preflight

    cfg = load_config(REPO / "params.yaml", experiment)
    limit = QueryLimit.for_base(cfg.train.model.base, cfg.ingest.max_query_tokens)
    tokenizer = counting_tokenizer(cfg.train.model.base)[0]
    n = cfg.ingest.max_query_tokens
    fits = TEXT * 40  # longer than the limit under any tokenizer (the real one is ~1 token per word)
    while len(query_ids(tokenizer, fits)) > n:
        fits = fits[:-1]
    limit.check(fits)  # at the limit: in
    with pytest.raises(Invalid) as e:
        limit.check(fits + " and more words")
    assert e.value.reason == R.QUERY_TOO_LONG
    assert preflight(cfg).tokens.query_tokens == n  # and pre-flight counted exactly that long a query
    assert preflight(cfg, query_tokens=n + 100).tokens.total == preflight(cfg).tokens.total + 100
