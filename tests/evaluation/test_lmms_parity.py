"""Parity by test: our readers of lmms-eval's answers (`evaluation.lmms_parse`) against lmms-eval 0.7.3's own
`extract_time` functions, loaded by path from the installed package (`make setup` installs it with --no-deps), on
a battery of answers of the kinds models write; and the profile's prompt and decoding against the task's yaml."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from evaluation import benchmark, lmms_parse
from evaluation.benchmark import PROFILE_DIR, load_profile, parser_entry, profile_entry
from vtg.config import PipelineConfig
from vtg.errors import VTGError
from vtg.harness import HarnessMismatch, require_comparable

BATTERY = [
    # the prompt's format, with each dash and with "to"
    "The event happens in the 2.5 - 7.0 seconds.",
    "The event happens in 2.5 – 7.0 seconds.",
    "The event happens in 2.5—7.0 seconds.",
    "The event happens in 3.5–6.0s",
    "The event happens in 2.5 to 7.0 seconds.",
    "The event happens in 5-10 seconds.",
    "The event happens in 100 - 120 seconds",
    # "from X to Y", with and without a keyword
    "From 3 to 9 seconds.",
    "The event happens from 3.2 to 9.8 seconds.",
    "Event: 12.3 to 15.6",
    "The event happens in 2.5 seconds to 7.0 seconds.",
    # bare pairs
    "12.0 - 18.5",
    "12.0-18.5 seconds",
    "Answer: 3.4 - 8.9\n",
    "[5.0, 10.0]",
    # seconds suffixes
    "The event happens in 2.5s - 7.0s.",
    "The event happens in 2.5 sec - 7.0 sec.",
    "The event happens in 2.5sec - 7.0sec",
    "The event happens in 2.5 seconds - 7.0 seconds.",
    "The event happens in 3.5 s – 6.0 s.",
    "The event starts at 2.5s and ends at 7.0s.",
    # several pairs
    "1.0 - 2.0 and then 5.0 - 6.0",
    "The event happens in 1.0 - 2.0 seconds and again in 5.0 - 6.0 seconds.",
    "The event happens in 0 - 30.0 seconds.\nThe event happens in 2 - 4 seconds.",
    "The video starts at 0 and ends at 30.\nThe event happens in 4.0 – 9.0 seconds.",
    "Step 1: the person starts walking.\nThe event happens in 4.0 – 9.0 seconds.",
    "from 90 to 105 seconds (1:30 to 1:45)",
    # clock times
    "The event starts at 00:00:18 and ends at 00:00:23.",
    "Start: 00:00:18\nEnd: 00:00:23",
    "The event happens in 00:18 - 00:23.",
    "The event happens from 0:18 to 0:23.",
    "The event happens in 01:02:03 – 01:02:09.",
    "The event happens at 1:05.5 - 1:09.25",
    "Between 1:30 and 1:45",
    "The event 'person flipped the light switch near the door' starts at 00:00:18 and ends at 00:00:23.",
    # reversed pairs
    "The event happens in 9.0 - 3.0 seconds.",
    "Start time: 8.5\nEnd time: 4",
    "It starts at 8.5 and ends at 4",
    # the prompts' own examples, and the template echoed
    "A specific example is : 20.8 - 30.0 seconds. The event happens in 1 - 2",
    "The event happens in the 10.5 - 15.2 seconds. A specific example is : 20.8 - 30.0 seconds",
    "The event 'person turn a light on' happens in the 24.3 - 30.4 seonds.",
    "The event happens in the 24.3 - 30.4 seonds. Now 5 - 6",
    "The event happens in <start time> - <end time> seconds.",
    "The event happens in the start time - end time.",
    # no pair at all
    "I cannot tell.",
    "",
    "The event happens at 5 seconds.",
    "The person turns on the light.",
    # numbers that are not times
    "2 people walk in. The event happens in 4.0 - 9.0 seconds.",
    "The 3rd person opens the door at 5 seconds and leaves at 11 seconds.",
    "Person 2 sits down between 6 and 12 seconds.",
    "2 people talk from 4 to 9 seconds.",
    "2 people are in the room.\nThe event would happen between 4 and 9 seconds.",
    # decimals with trailing dots
    "The event happens in 4. - 9. seconds.",
    "The event happens in 4.-9.",
    "The event starts at 4.\nThe event ends at 9.",
    # keywords in different sentences, separators, newlines
    "The event starts at 3.5 seconds. It ends at 8 seconds.",
    "The event starts at 3.5 seconds! It ends at 8 seconds!",
    "Start time? 3.5 seconds. End time? 8 seconds.",
    "Starting time: 0.8 seconds\nEnding time: 1.1 seconds",
    "The start time for this event is 0 seconds, and the end time is 12 seconds.",
    "The event starts at 12.3 seconds, and the end time is 15.6 seconds.",
    "In the video, the person turns on the light\n(happens in 3.5 - 6.0 seconds).",
    "The event happens between 7 and 12 seconds.",
    # "to" inside words, upper case
    "The person stops the video, then 10 - 20.",
    "The person puts tomatoes away from 10 to 20 seconds.",
    "THE EVENT HAPPENS IN 2.5 TO 7.0 SECONDS.",
    "The Event Starts At 4.2 And Ends At 8.8 Seconds",
]
TASKS = sorted(lmms_parse.TASK_FILES)


@pytest.fixture(scope="module", params=TASKS)
def theirs(request):
    """(task, lmms-eval 0.7.3's own extract_time for it), loaded by path from the installed package."""
    if lmms_parse.installed_file(request.param) is None:
        pytest.skip(f"lmms-eval {lmms_parse.LMMS_EVAL_VERSION} is not installed (make setup installs it: "
                    f"pip install --no-deps lmms-eval=={lmms_parse.LMMS_EVAL_VERSION})")
    return request.param, lmms_parse.installed_extract_time(request.param)


def test_the_battery_is_broad():
    assert len(BATTERY) >= 40 and len(set(BATTERY)) == len(BATTERY)


def test_our_readers_read_every_answer_as_lmms_eval_does(theirs):
    task, extract_time = theirs
    assert extract_time.__code__.co_filename == str(lmms_parse.installed_file(task))  # theirs, not ours
    ours = lmms_parse.OURS[task]
    differ = [f"{answer!r}: lmms-eval {extract_time(answer)} vs ours {ours(answer)}" for answer in BATTERY
              if [tuple(p) for p in extract_time(answer)] != ours(answer)]
    assert not differ, f"{task}: {len(differ)} of {len(BATTERY)} answers read differently:\n" + "\n".join(differ)


def test_the_reader_at_run_time_is_lmms_evals_own_where_installed(theirs):
    task, _ = theirs
    read, source = lmms_parse.reader(task)
    assert source == f"lmms-eval 0.7.3 {lmms_parse.TASK_FILES[task][0]}:extract_time"
    assert [read(a) for a in BATTERY] == [lmms_parse.OURS[task](a) for a in BATTERY]


def test_without_lmms_eval_a_run_reads_with_ours(monkeypatch):
    monkeypatch.setattr(lmms_parse, "installed_file", lambda task: None)
    lmms_parse.reader.cache_clear()
    try:
        assert lmms_parse.reader("charades_sta") == (lmms_parse.charades_sta_spans,
                                                     "evaluation.lmms_parse.charades_sta_spans")
        assert lmms_parse.lmms_eval_span("The event happens in 2.5 – 7.0 seconds.") == (2.5, 7.0)
        assert lmms_parse.lmms_eval_span("I cannot tell.") is None
        assert lmms_parse.timelens_span("The event happens in 9.0 - 3.0 seconds.") == (9.0, 3.0)  # as written
    finally:
        lmms_parse.reader.cache_clear()


def test_load_function_runs_only_the_function(tmp_path):
    src = tmp_path / "task.py"
    src.write_text("import re\nimport not_a_module_here\n\ndef helper(x):\n    return re.sub('a', 'b', x)\n\n"
                   "def extract_time(p):\n    return helper(p)\n\n"
                   "def needs(p):\n    return not_a_module_here.f(p)\n")
    assert lmms_parse.load_function(src, "extract_time")("aa") == "bb"
    with pytest.raises(LookupError, match="not_a_module_here"):
        lmms_parse.load_function(src, "needs")


@pytest.mark.parametrize("answer, span", [  # lmms-eval 0.7.3's readings, kept here for a run without it
    ("The event happens in the 2.5 - 7.0 seconds.", (2.5, 7.0)),
    ("The event happens in 2.5 – 7.0 seconds.", (2.5, 7.0)),  # en dash
    ("The event happens in 2.5—7.0 seconds.", None),  # em dash: one sentence, one first number
    ("From 3 to 9 seconds.", (3.0, 9.0)),  # every 'to' becomes '-'; no keyword sentence: all sentences
    ("The event happens in 2.5s - 7.0s.", (2.5, 7.0)),  # the suffixed pairs, last
    ("Start time: 8.5\nEnd time: 4", (4.0, 8.5)),  # the first number of each keyword sentence, ordered
    ("It starts at 8.5 and ends at 4", None),  # one sentence (only ! ? and newlines split): one number
    ("1.0 - 2.0 and then 5.0 - 6.0", (1.0, 2.0)),  # several pairs: the first
    ("A specific example is : 20.8 - 30.0 seconds. The event happens in 1 - 2", (1.0, 2.0)),
    ("The event starts at 00:00:18 and ends at 00:00:23.", (18.0, 23.0)),  # clock times before numbers
    ("The event happens in 00:18 - 00:23.", (18.0, 23.0)),
    ("The event happens in 4. - 9. seconds.", None),  # a trailing dot ends no number of a pair
    ("I cannot tell.", None),
])
def test_charades_sta_reading(answer, span):
    spans = lmms_parse.charades_sta_spans(answer)
    assert (spans[0] if spans else None) == span


@pytest.mark.parametrize("answer, spans", [
    ("The event happens in 2.5 - 7.0 seconds.", [(2.5, 7.0)]),
    ("The event happens in 9.0 - 3.0 seconds.", [(9.0, 3.0)]),  # as written
    ("The event happens in 2.5 – 7.0 seconds.", [(2.5, 7.0)]),  # en dash: not a pair, but the only two numbers
    ("2 people talk from 4 to 9 seconds.", [(4.0, 9.0)]),
    ("1.0 - 2.0 and then 5.0 - 6.0", [(1.0, 2.0), (5.0, 6.0)]),  # every pair; the task scores the first
    ("The event happens at 1:05.5 - 1:09.25", [(65.5, 69.25)]),  # clock times first, anywhere
    ("2 people walk in. The event happens in 4.0 - 9.0 seconds.", [(4.0, 9.0)]),
    ("The event happens at 5 seconds.", []),
])
def test_timelens_reading(answer, spans):
    assert lmms_parse.timelens_spans(answer) == spans


def _card(profile, implementation: str) -> dict:
    parser = {**parser_entry(profile), "implementation": implementation}
    return {"protocol": "full_video", "parser": parser, "profile": profile_entry(profile, PipelineConfig())}


def test_the_card_carries_the_lmms_eval_version_and_versions_are_never_ranked_together():
    profile = load_profile("lmms_eval_charades")
    assert profile.lmms_eval_version == "0.7.3"
    assert profile_entry(profile, PipelineConfig())["lmms_eval_version"] == "0.7.3"
    assert parser_entry(profile)["version"] == "lmms-eval 0.7.3 tasks/charades_sta/utils.py:extract_time"
    ours, theirs = _card(profile, "evaluation.lmms_parse"), _card(profile, "lmms-eval 0.7.3")
    require_comparable([("with lmms-eval", theirs), ("without", ours)])  # the same spans, by test
    later = {**ours, "profile": {**ours["profile"], "lmms_eval_version": "0.8.0"}}
    with pytest.raises(HarnessMismatch, match="profile.lmms_eval_version: '0.7.3' vs '0.8.0'"):
        require_comparable([("0.7.3", ours), ("0.8.0", later)])


def test_a_profile_of_another_lmms_eval_version_is_refused(tmp_path, monkeypatch):
    profile = json.loads((PROFILE_DIR / "lmms_eval_charades.json").read_text())
    (tmp_path / "later.json").write_text(json.dumps({**profile, "lmms_eval_version": "0.8.0"}))
    monkeypatch.setattr(benchmark, "PROFILE_DIR", tmp_path)
    with pytest.raises(VTGError, match="lmms-eval 0.8.0, but evaluation.lmms_parse reads"):
        load_profile("later")


def test_the_profile_is_lmms_evals_charades_task():
    profile = json.loads((PROFILE_DIR / "lmms_eval_charades.json").read_text())
    assert profile["lmms_eval_version"] == lmms_parse.LMMS_EVAL_VERSION
    assert profile["parser"]["task"] == "charades_sta"
    path = lmms_parse.installed_file("charades_sta")
    if path is None:
        pytest.skip(f"lmms-eval {lmms_parse.LMMS_EVAL_VERSION} is not installed")
    lines = (path.parent / "charades.yaml").read_text().splitlines()
    task = yaml.safe_load("\n".join(line for line in lines if "!function" not in line))
    kwargs = task["lmms_eval_specific_kwargs"]["default"]
    assert profile["query_template"] == f"{kwargs['pre_prompt']}{{query}}. {kwargs['post_prompt']}"
    assert profile["pre_prompt"] == kwargs["pre_prompt"] and profile["post_prompt"] == kwargs["post_prompt"]
    assert profile["decoding"]["max_new_tokens"] == task["generation_kwargs"]["max_new_tokens"]
    root = path.parents[3]  # site-packages: the profile's files are the installed ones
    for rel, sha256 in profile["source"]["sha256"].items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == sha256, rel
