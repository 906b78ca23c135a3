"""`train.data.mix`'s sources beside the grounding shards: general-task suites as training examples, the checks of
a mix against its suites and the shards' sources, and the seeded interleave (one draw per stream position, so a
resume replays the same mix). The shard stream (`training.data.ShardStream`) builds its streams from these."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from vtg.errors import VTGError
from vtg.model.processing import VisionParams, example_ids, video_grid


@lru_cache(maxsize=8)
def _suite_clips(suite: str, num_frames: int, frame_size: int) -> tuple[tuple, ...]:
    """(item, frames, times) of every item of a general-task suite, decoded once per process."""
    from vtg.general_tasks import read_suite, suite_frames

    items = read_suite(suite)
    return tuple((item, *clip) for item, clip in zip(items, suite_frames(items, num_frames, frame_size)))


def general_rows(name: str, suite: str, frames: tuple[int, int], tokenizer, vision: VisionParams) -> list[dict]:
    """A suite's items as raw training examples: frames decoded, the item's answer the target, exact token count."""
    from vtg.general_tasks import answer_text as general_answer
    from vtg.general_tasks import prompt_text

    rows, counted = [], {}  # a suite repeats few (clip shape, times, question, answer): 299 of 4,706 on the default
    for item, arr, times in _suite_clips(suite, *frames):
        query, target = prompt_text(item), general_answer(item)
        text = (arr.shape, tuple(times), query, target)
        if text not in counted:
            grid = video_grid(len(arr), arr.shape[1], arr.shape[2], vision)
            prompt, answer, _, _ = example_ids(tokenizer, grid, times, query, target, vision)
            counted[text] = len(prompt) + len(answer)
        rows.append({"key": f"{name}:{item.id}", "frames": arr, "timestamps": list(times), "query": query,
                     "answer": target, "n_tokens": counted[text], "auto": False, "mix": name})
    return rows


def check_mix_suites(mix) -> None:
    """Every suite `train.data.mix` replays exists (one line naming it, before any work)."""
    for m in mix:
        if m.suite and not Path(m.suite).is_file():
            raise VTGError(f"train.data.mix {m.name!r}: suite {m.suite} does not exist (a general-task jsonl, "
                           "vtg/general_tasks.py; the synthetic corpus writes data/raw/synthetic/general/)")


def longest_general(mix, frames: tuple[int, int], tokenizer, vision: VisionParams) -> tuple[int, str] | None:
    """(tokens, key) of the longest general-task item `train.data.mix` replays (pre-flight counts it), or None."""
    check_mix_suites(mix)
    rows = [r for m in mix if m.suite for r in general_rows(m.name, m.suite, frames, tokenizer, vision)]
    return max(((r["n_tokens"], r["key"]) for r in rows), default=None)


def general_examples(name: str, suite: str, frames: tuple[int, int], tokenizer, vision: VisionParams,
                     seed: str) -> Iterator[dict]:
    """A suite's items as raw training examples (`general_rows`), forever: a fresh seeded permutation per pass,
    so the order depends only on (seed, pass)."""
    rows = general_rows(name, suite, frames, tokenizer, vision)
    epoch = 0
    while True:
        order = list(range(len(rows)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        yield from (rows[i] for i in order)
        epoch += 1


def check_mix_sources(mix, data_sources: list[dict], shards_dir: str, split: str) -> None:
    """Every grounding source a `train.data.mix` entry selects is one the shards hold (`vtg.shards.data_sources`):
    a filter that keeps nothing would never yield. One line otherwise."""
    known = {r["source"] for r in data_sources}
    for m in mix:
        if m.sources and not known:
            raise VTGError(f"train.data.mix {m.name!r} selects sources {m.sources}, but the shards in {shards_dir} "
                           "have no manifest with per-source counts (rerun preprocess)")
        if set(m.sources) - known:
            raise VTGError(f"train.data.mix {m.name!r}: sources {sorted(set(m.sources) - known)} are not in the "
                           f"{split} shards (they hold {', '.join(sorted(known))})")


def interleave(streams: dict[str, Iterator[dict]], weights: dict[str, float], rng: random.Random) -> Iterator[dict]:
    """One example at a time from the source `rng` draws by `weights` (one draw per stream position, so the same
    seed gives the same mix and a resume replays it exactly); ends when a drawn source ends."""
    names = list(weights)
    total = sum(weights.values())
    cum, acc = [], 0.0
    for n in names:
        acc += weights[n] / total
        cum.append(acc)
    while True:
        r = rng.random()
        name = names[next((i for i, c in enumerate(cum) if r < c), len(names) - 1)]
        try:
            yield next(streams[name])
        except StopIteration:
            return


