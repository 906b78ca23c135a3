"""lmms-eval's answer reading for its temporal grounding tasks, as lmms-eval 0.7.3 ships it, so that a profile
scores an answer exactly as lmms-eval's task does, including where that differs from our parser (`vtg.answer`).

Two readers, each a copy of one function of lmms-eval 0.7.3 (`LMMS_EVAL_VERSION`), pinned to it by
tests/evaluation/test_lmms_parity.py on the same battery of answers:

- `charades_sta_spans`: `extract_time` of lmms_eval/tasks/charades_sta/utils.py, the function the task
  `temporal_grounding_charades` scores with (eval_tvg.py beside it is an older standalone script).
- `timelens_spans`: `extract_time` of lmms_eval/tasks/timelens/utils.py (tasks `timelens_charades`,
  `timelens_activitynet`, `timelens_qvhighlights`).

A run never needs lmms-eval. Where that exact file is installed (`pip install --no-deps lmms-eval==0.7.3`, the
Makefile does), `reader` calls lmms-eval's own function instead, loaded by path: only the function's source is
compiled (the task modules import loguru and lmms_eval at their top), and only when the file's sha256 is the
0.7.3 file's, so another lmms-eval version never silently changes what a profile means.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

Spans = list[tuple[float, float]]

LMMS_EVAL_VERSION = "0.7.3"
"""The lmms-eval release both readers mirror (the profiles name it, the harness card carries it)."""
TASK_FILES = {
    "charades_sta": ("lmms_eval/tasks/charades_sta/utils.py",
                     "822dc5e9194f7097b463d724d3a3d42459611915f80910e3c3fb13c588412edc"),
    "timelens": ("lmms_eval/tasks/timelens/utils.py",
                 "5f339b83f140394b30bac724ae887c2892a6410a428f52b818b20d5eadc90dae"),
}
"""Per task: the file in the lmms-eval 0.7.3 wheel that holds its `extract_time`, and that file's sha256."""

# charades_sta/utils.py
_EXAMPLE = "a specific example is : 20.8 - 30.0 seconds"
_KEYWORDS = ("starts", "ends", "happens in", "start time", "end time", "start", "end", "happen")
_CLOCK_RANGE = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\s*[–-]\s*(\d{1,2}:\d{2}(?::\d{2})?)\b")
_PAIR = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?)\b")
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}(?::\d{2})?)\b")
_SUFFIXED_PAIR = re.compile(r"(\d+(?:\.\d+)?)\s*s?\s*[–-]\s*(\d+(?:\.\d+)?)\s*s?")

# timelens/utils.py
_TL_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}:\d{2}(?:\.\d+)?|\d{1,2}:\d{2}(?:\.\d+)?)\b")
_TL_PAIRS = (re.compile(r"(\d+\.?\d*)\s*-\s*(\d+\.?\d*)"), re.compile(r"(\d+\.?\d*)\s+to\s+(\d+\.?\d*)"))
_TL_NUMBER = re.compile(r"\b\d+\.?\d*\b")


def _paired(values: list[float]) -> Spans:
    values = values[: len(values) // 2 * 2]
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def _first_sentence_pairs(sentences: list[str], pattern: re.Pattern, to_seconds: Callable) -> Spans:
    """Every pair of the first sentence that holds one."""
    for sentence in sentences:
        if found := pattern.findall(sentence):
            return [(to_seconds(a), to_seconds(b)) for a, b in found]
    return []


def _clock_seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    if len(parts) == 3:
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    return parts[0] * 60 + parts[1]


def charades_sta_spans(answer: str) -> Spans:
    """The pair lmms-eval 0.7.3's `temporal_grounding_charades` reads from `answer` ([] or one, ordered).

    Lower-case, drop the example sentence, every `to` (also inside words) becomes `-`; split into sentences at
    `!`, `?` and newlines and keep those holding a start/end keyword (none: all of them). Then, the first step that
    finds anything: the clock ranges (`m:ss - m:ss`, `h:mm:ss – h:mm:ss`) of the first sentence holding one; its
    number pairs joined by a hyphen or an en dash (never an em dash); every clock time of all sentences, paired
    in order; the first number of each sentence, paired in order; number pairs with an `s` suffix (`2.5s - 7s`).
    The first pair counts, ordered (start <= end)."""
    text = answer.lower().replace(_EXAMPLE, "").replace("to", "-")
    sentences = re.split(r"[!?\n]", text)
    candidates = [s for s in sentences if any(k in s for k in _KEYWORDS)] or sentences
    found = (_first_sentence_pairs(candidates, _CLOCK_RANGE, _clock_seconds)
             or _first_sentence_pairs(candidates, _PAIR, float)
             or _paired([_clock_seconds(t) for s in candidates for t in _CLOCK.findall(s)])
             or _paired([float(m[0]) for s in candidates if (m := _NUMBER.findall(s))])
             or _first_sentence_pairs(candidates, _SUFFIXED_PAIR, float))
    return [(a, b) if b > a else (b, a) for a, b in found[:1]]


def _timelens_clock_seconds(clock: str) -> float:
    parts = clock.split(":")
    if len(parts) == 3:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + float(parts[2])
    return int(parts[0]) * 60 + float(parts[1])


def timelens_spans(answer: str) -> Spans:
    """Every pair lmms-eval 0.7.3's `timelens` tasks read from `answer`, as written (a reversed pair stays
    reversed); the task scores the first.

    Lower-case; the first step that finds anything: all clock times (`h:mm:ss`, `m:ss`, seconds may carry
    decimals) of the whole answer, paired in order; every `a - b` (hyphen only), else every `a to b`; all numbers
    of the answer, paired in order."""
    text = answer.lower()
    found = _paired([_timelens_clock_seconds(c) for c in _TL_CLOCK.findall(text)])
    if not found:
        for pattern in _TL_PAIRS:
            if found := [(float(a), float(b)) for a, b in pattern.findall(text)]:
                break
    return found or _paired([float(n) for n in _TL_NUMBER.findall(text)])


OURS: dict[str, Callable[[str], Spans]] = {"charades_sta": charades_sta_spans, "timelens": timelens_spans}


def _free_names(functions: list[ast.FunctionDef]) -> set[str]:
    """Names the functions read that neither they, their arguments nor the builtins define."""
    loads, defined = set(), {f.name for f in functions}
    for node in (n for f in functions for n in ast.walk(f)):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return loads - defined - set(dir(builtins))


def load_function(path: str | Path, name: str) -> Callable:
    """Function `name` of the Python file `path`, with the module-level functions it calls, compiled alone: the
    file's other top-level code (its imports of third-party packages, its config reads) never runs. Modules of
    the standard library it imports at top level are imported for it; any other name it needs is an error."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if name not in top:
        raise LookupError(f"{path}: no function {name}")
    namespace: dict = {}
    for alias in (a for node in tree.body if isinstance(node, ast.Import) for a in node.names):
        root = alias.name.split(".")[0]
        if root in sys.stdlib_module_names:
            namespace[alias.asname or root] = importlib.import_module(alias.name if alias.asname else root)
    wanted, queue = {}, [name]
    while queue:
        fn = top[queue.pop()]
        wanted[fn.name] = fn
        calls = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        queue += [c for c in calls if c in top and c not in wanted]
    functions = list(wanted.values())
    missing = _free_names(functions) - namespace.keys()
    if missing:
        raise LookupError(f"{path}: {name} needs {sorted(missing)}, which loading it alone does not provide")
    # the function's own source only, compiled under the file's name (tracebacks point into lmms-eval's file)
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace[name]


def installed_file(task: str) -> Path | None:
    """The installed lmms-eval's file for `task` if it is exactly the 0.7.3 file (`TASK_FILES`), else None."""
    rel, sha256 = TASK_FILES[task]
    try:
        dist = importlib.metadata.distribution("lmms-eval")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(rel))
    if dist.version != LMMS_EVAL_VERSION or not path.is_file():
        return None
    return path if hashlib.sha256(path.read_bytes()).hexdigest() == sha256 else None


def installed_extract_time(task: str) -> Callable[[str], list] | None:
    """lmms-eval 0.7.3's own `extract_time` for `task`, loaded by path, or None where that file is not installed."""
    path = installed_file(task)
    return load_function(path, "extract_time") if path else None


@cache
def reader(task: str) -> tuple[Callable[[str], Spans], str]:
    """(spans of an answer, where that function comes from) for lmms-eval task `task`: lmms-eval's own function
    where the 0.7.3 file is installed, else ours (the same answers, by test)."""
    try:
        theirs = installed_extract_time(task)
    except (LookupError, OSError, SyntaxError):
        theirs = None
    if theirs is None:
        return OURS[task], f"evaluation.lmms_parse.{OURS[task].__name__}"

    def spans(answer: str) -> Spans:
        try:
            return [(float(a), float(b)) for a, b in theirs(answer)]
        except Exception:  # noqa: BLE001 - lmms-eval's Charades metric scores an answer it fails on as IoU 0
            return []
    return spans, f"lmms-eval {LMMS_EVAL_VERSION} {TASK_FILES[task][0]}:extract_time"


def lmms_eval_spans(answer: str) -> Spans:
    """The pairs `temporal_grounding_charades` reads from `answer` (at most one, ordered)."""
    return reader("charades_sta")[0](answer)


def lmms_eval_span(answer: str) -> tuple[float, float] | None:
    """The span `temporal_grounding_charades` scores, or None (it scores IoU 0: not exactly one pair)."""
    spans = lmms_eval_spans(answer)
    return spans[0] if len(spans) == 1 else None


def timelens_span(answer: str) -> tuple[float, float] | None:
    """The span the `timelens` tasks score (their first pair, as written), or None (IoU 0: no pair). A reversed
    pair stays reversed: lmms-eval's `iou` scores it 0, as `vtg.spans.temporal_iou` does."""
    spans = reader("timelens")[0](answer)
    return spans[0] if spans else None


SCORED: dict[str, Callable[[str], tuple[float, float] | None]] = {"charades_sta": lmms_eval_span,
                                                                  "timelens": timelens_span}


def task_span(task: str, answer: str) -> tuple[float, float] | None:
    """The span lmms-eval task `task` scores from `answer`, or None (IoU 0)."""
    return SCORED[task](answer)
