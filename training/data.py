"""WebDataset streaming of training shards as a list of stages (open_clip style), deterministic and resumable.

    shard list (reshuffled per epoch by seed; repeated forever when `resampled`)
    -> split_by_node -> split_by_worker -> open tar -> group members by sample key
    -> expand: one raw example per query (JPEG bytes kept, nothing decoded yet; bad JSON skipped + counted)
    -> shuffle buffer (seeded per rank and worker)
    -> token-budget batching (short sequences in bigger batches; length groups: similar lengths together)
    -> skip the batches a resumed run already consumed (cheap: nothing decoded)
    -> decode JPEGs + encode (chat template, patchify) + collate: padded to the longest, or packed end to end in
       rows (`train.data.packing`, vtg/model/packing.py) (undecodable frames skipped + counted)

Every stage is deterministic given (seed, rank, worker), and the DataLoader hands out worker batches round
robin, so the data position is one number: batches consumed by this rank. Errors reach the main process
attached to the batch they were found in (`batch["data_errors"]`), so the loop can count and log them.
"""

from __future__ import annotations

import io
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from pathlib import Path

import torch
import webdataset as wds

from training.batching import length_grouped_batches, packed_batches
from training.mix import general_examples, interleave
from vtg.errors import VTGError
from vtg.model.packing import pack
from vtg.model.processing import (
    VisionParams,
    answer_text,
    collate,
    encode_example,
    example_ids,
    video_grid,
)
from vtg.shards import SampleMeta, decode_jpegs, list_shards, member_key, read_manifest
from vtg.sources import is_auto

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class StreamSpec:
    """Everything a worker needs to rebuild the same stream (picklable)."""

    urls: tuple[str, ...]
    seed: int
    resampled: bool = True
    shuffle_buffer: int = 256
    micro_batch_size: int = 16
    token_budget: int = 0
    length_groups: int = 0
    """Batches per length-sorted group (`train.data.length_groups`); 0: batches in stream order."""
    packing: bool = False
    """Pack each micro-batch's examples in rows (`vtg.model.packing.pack`); the budget then counts real tokens."""
    pack_length: int = 0
    one_row: bool = False
    """Packing: the whole micro-batch in one row (flash-attn's varlen kernels), else rows of its longest example."""
    max_seq_len: int = 2048
    skip_batches: int = 0
    """Batches of this rank's stream already consumed (exact resume)."""
    keep: tuple[float, float] = (1.0, 1.0)
    """(probability a labelled query is kept, probability an auto-labelled one is: `source_keep`)."""
    mix: tuple[tuple[str, float, str, tuple[str, ...]], ...] = ()
    """`train.data.mix` as (name, weight, suite path or "" for the grounding shards, source ids); () : no mix."""
    general_frames: tuple[int, int] = (8, 56)
    """(frames, frame size) a general-task item is encoded at (`evaluate.forgetting`'s, as it is asked)."""


class ErrorLog:
    """wds-style exception handler that skips and records (reason, where)."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []

    def __call__(self, exn: Exception) -> bool:
        where = next((str(a) for a in reversed(exn.args) if isinstance(a, str) and a.endswith(".tar")), "")
        self.add(f"unreadable_shard: {type(exn).__name__}: {str(exn.args[0]) if exn.args else exn}", where)
        return True

    def add(self, reason: str, where: str) -> None:
        self.pending.append((reason, where))

    def drain(self) -> list[tuple[str, str]]:
        out, self.pending = self.pending, []
        return out


def shard_epochs(urls: tuple[str, ...], seed: int, resampled: bool) -> Iterator[dict]:
    """The shard list, reshuffled each epoch by (seed, epoch); forever when `resampled`."""
    epoch = 0
    while True:
        order = list(urls)
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        yield from ({"url": u} for u in order)
        epoch += 1
        if not resampled:
            return


@lru_cache(maxsize=64)
def _manifest_counts(root: str) -> dict[str, int]:
    """Samples per shard path (absolute) as the manifest in `root` lists them; {} without a manifest."""
    manifest = read_manifest(root) or {}
    return {str((Path(root) / e["path"]).resolve()): int(e.get("samples", 0)) for e in manifest.get("shards") or []
            if isinstance(e, dict) and e.get("path")}


def expected_samples(url: str) -> int | None:
    """How many samples the manifest beside a local shard (`<root>/<split>/shard-N.tar`) says it holds."""
    if "://" in url:
        return None
    path = Path(url).resolve()
    return _manifest_counts(str(path.parents[1])).get(str(path))


def _reraise(exn: Exception) -> bool:
    raise exn


def _complete(sample: dict) -> bool:
    try:
        n = json.loads(sample["json"])["num_frames"]
        return all(f"f{i:03d}.jpg" in sample for i in range(n))
    except Exception:  # noqa: BLE001 - anything unreadable is incomplete
        return False


def shard_samples(src: Iterator[dict], errors: ErrorLog) -> Iterator[dict]:
    """Shard urls -> samples (members grouped by key), one shard at a time. A shard that cannot be opened, fails
    mid-read, ends inside a sample, or holds fewer samples than the manifest lists is ONE error per pass over it
    (not one per sample): the shard, the last good key, and how many samples were read vs how many the manifest
    says it holds (the keys after the error point are unknown)."""
    for item in src:
        url = item["url"]
        n, last, held, failure = 0, None, None, None
        try:
            members = wds.tariterators.tar_file_expander(wds.tariterators.url_opener([item], handler=_reraise),
                                                         handler=_reraise)
            for sample in wds.tariterators.group_by_keys(members, keys=member_key, handler=_reraise):
                if held is not None:
                    n, last = n + 1, held.get("__key__")
                    yield held
                held = sample
        except Exception as e:  # noqa: BLE001 - an unreadable shard is counted and skipped, never fatal
            failure = f"{type(e).__name__}: {str(e.args[0]) if e.args else e}"
        cut = None
        if held is not None:  # the last sample: incomplete means the shard was cut inside it
            if _complete(held):
                n, last = n + 1, held.get("__key__")
                yield held
            else:
                cut = held.get("__key__")
        want = expected_samples(url)
        if failure is None and cut is None and (want is None or n >= want):
            continue
        why = failure or (f"ended inside sample {cut}" if cut else "ended early")
        lost = (f"{want - n} of its {want} samples lost" if want is not None and want >= n
                else "samples after it lost (count unknown: no manifest)")
        errors.add(f"unreadable_shard: {why}; read {n} samples (last good key {last or '-'}), {lost}; keys after "
                   "the error point unknown", url)


def _image_size(jpeg: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        return im.height, im.width


BAD_RUN_LIMIT = 1000
"""Skipped samples (or queries) in a row after which the stream stops with an error: past this, the data is broken,
not noisy, and a stream that resamples would otherwise spin on it forever without a step (the sanity check before
step 1 sees only the first shards)."""


class Expander:
    """Grouped tar members -> one raw example per query (frames stay JPEG bytes until the batch is decoded), with
    its exact token count (`n_tokens`: the text side of `encode_example`, `example_ids`, on the grid the frames will
    have), which batching and packing plan with."""

    def __init__(self, tokenizer, vision: VisionParams, errors: ErrorLog):
        self.tokenizer, self.vision, self.errors = tokenizer, vision, errors
        self.bad_run = 0
        """Samples in a row without one example (`BAD_RUN_LIMIT`)."""

    def _bad(self, reason: str, where: str) -> None:
        self.errors.add(reason, where)
        self.bad_run += 1
        if self.bad_run >= BAD_RUN_LIMIT:
            raise VTGError(f"{self.bad_run} training samples in a row gave no example (last: {reason} at {where}): "
                           "the shards past this point are broken; re-run preprocess (python -m "
                           "beam_jobs.preprocess) or restore them (`dvc checkout`)")

    def __call__(self, samples: Iterator[dict]) -> Iterator[dict]:
        for s in samples:
            key = s.get("__key__", "?")
            try:
                meta = SampleMeta.model_validate(json.loads(s["json"]))
                jpegs = [s[f"f{i:03d}.jpg"] for i in range(meta.num_frames)]
                if len(meta.frame_timestamps) != meta.num_frames:
                    raise ValueError(f"{len(meta.frame_timestamps)} timestamps for {meta.num_frames} frames")
                h, w = _image_size(jpegs[0])
            except Exception as e:  # noqa: BLE001 - any malformed sample is skipped and counted, never fatal
                self._bad(f"bad_sample: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                          f"{s.get('__url__', '')}:{key}")
                continue
            grid = video_grid(meta.num_frames, h, w, self.vision)
            for qi, q in enumerate(meta.queries):
                try:  # one bad query (no window, say) is skipped and counted; its video's other queries train
                    prompt, answer, _, _ = example_ids(self.tokenizer, grid, meta.frame_timestamps, q.text,
                                                       answer_text(q.windows), self.vision)
                except Exception as e:  # noqa: BLE001
                    self._bad(f"bad_query: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}",
                              f"{s.get('__url__', '')}:{key}#{qi}")
                    continue
                self.bad_run = 0
                yield {"key": f"{meta.key}#{qi}", "jpegs": jpegs, "timestamps": meta.frame_timestamps,
                       "query": q.text, "windows": q.windows, "n_tokens": len(prompt) + len(answer),
                       "auto": is_auto(q.source), "source": q.source or meta.source}


def source_keep(rows: list[dict], auto_share: float | None) -> tuple[float, float]:
    """(keep probability of a labelled query, of an auto-labelled one) that makes auto labels `auto_share` of the
    examples SFT sees, from the shards' per-source query counts (`vtg.shards.data_sources`): the rarer side is
    kept whole, the other thinned. None (or no auto label in the shards): everything as it comes, (1, 1)."""
    auto = sum(r["queries"] for r in rows if is_auto(r["source"]))
    human = sum(r["queries"] for r in rows) - auto
    if auto_share is None or auto == 0:
        return 1.0, 1.0
    if human == 0:
        if auto_share < 1:
            raise VTGError(f"train.data.auto_share={auto_share}: the train shards hold only auto labels ({auto}), "
                           "so no mix can have labelled queries; set it to 1 or null, or add labelled data")
        return 0.0, 1.0
    if auto_share >= auto / (auto + human):  # fewer labelled ones
        return (auto * (1 - auto_share)) / (auto_share * human), 1.0
    return 1.0, (auto_share * human) / ((1 - auto_share) * auto)


def keep_by_source(examples: Iterator[dict], keep: tuple[float, float], rng: random.Random) -> Iterator[dict]:
    """Examples thinned by `keep` (`source_keep`); a draw per example from `rng`, so the same stream and seed keep
    the same examples (exact resume)."""
    for ex in examples:
        if rng.random() < keep[1 if ex["auto"] else 0]:
            yield ex


class ShardStream(torch.utils.data.IterableDataset):
    """The training stream of one rank; each DataLoader worker runs its own disjoint part of it."""

    def __init__(self, spec: StreamSpec, tokenizer, vision: VisionParams | None = None):
        super().__init__()
        self.spec, self.tokenizer, self.vision = spec, tokenizer, vision or VisionParams()

    def _worker(self) -> tuple[int, int, int]:
        rank, _, worker, num_workers = wds.utils.pytorch_worker_info()
        return rank, worker, num_workers

    def raw_batches(self, errors: ErrorLog) -> Iterator[list[dict]]:
        s = self.spec
        rank, worker, num_workers = self._worker()
        # The DataLoader asks workers round robin starting at worker 0, so after k consumed batches the next
        # one must come from the worker that would have produced batch k: physical worker w plays logical
        # worker (w + k) mod W, and skips the batches that logical worker already delivered.
        logical = (worker + s.skip_batches) % num_workers
        skip = max(0, -(-(s.skip_batches - logical) // num_workers))
        order = random.Random(f"batches:{s.seed}:{rank}:{logical}")  # its own stream: the shuffle's is unchanged
        return islice(self.batches(self.examples(errors, rank, logical, num_workers), order), skip, None)

    def examples(self, errors: ErrorLog, rank: int, logical: int, num_workers: int) -> Iterator[dict]:
        """One logical worker's raw examples as batching takes them: grounding (or `mix`ed), then shuffled."""
        s = self.spec
        examples = (self.mixed(errors, rank, logical, num_workers) if s.mix else
                    self.grounding(errors, rank, logical, num_workers))
        rng = random.Random(s.seed * 1_000_003 + rank * 1_009 + logical)
        return wds.shuffle(s.shuffle_buffer, initial=s.shuffle_buffer, rng=rng)(examples)

    def batches(self, examples: Iterator[dict], order: random.Random) -> Iterator[list[dict]]:
        """Raw examples -> raw batches: packed (`packing`) or by token budget and length groups; `order` draws the
        order of a pool's batches."""
        s = self.spec
        if s.packing:
            return packed_batches(examples, s.micro_batch_size, s.token_budget, s.length_groups, s.pack_length,
                                  s.one_row, order)
        return length_grouped_batches(examples, s.micro_batch_size, s.token_budget, s.length_groups, order)

    def grounding(self, errors: ErrorLog, rank: int, logical: int, num_workers: int,
                  sources: tuple[str, ...] = (), name: str | None = None) -> Iterator[dict]:
        """This worker's grounding examples (one per query), thinned by `keep`; only `sources` when given."""
        s = self.spec
        src = wds.split_by_node(shard_epochs(s.urls, s.seed, s.resampled))
        src = islice(src, logical, None, num_workers)
        examples = Expander(self.tokenizer, self.vision, errors)(shard_samples(src, errors))
        if s.keep != (1.0, 1.0):
            examples = keep_by_source(examples, s.keep, random.Random(f"mix:{s.seed}:{rank}:{logical}"))
        if sources:
            examples = (ex for ex in examples if ex["source"] in sources)
        if name is not None:
            examples = ({**ex, "mix": name} for ex in examples)
        return examples

    def mixed(self, errors: ErrorLog, rank: int, logical: int, num_workers: int) -> Iterator[dict]:
        """`train.data.mix`: each position's source drawn by weight (seeded per rank and logical worker)."""
        s, streams, weights = self.spec, {}, {}
        for name, weight, suite, sources in s.mix:
            weights[name] = weight
            streams[name] = (general_examples(name, suite, s.general_frames, self.tokenizer, self.vision,
                                              f"mixitems:{s.seed}:{rank}:{logical}:{name}") if suite else
                             self.grounding(errors, rank, logical, num_workers, tuple(sources), name))
        return interleave(streams, weights, random.Random(f"mixsrc:{s.seed}:{rank}:{logical}"))

    def encode(self, raw: list[dict], errors: ErrorLog) -> list[dict]:
        out = []
        for ex in raw:
            try:
                frames = ex["frames"] if "frames" in ex else decode_jpegs(ex["jpegs"])
                answer = ex["answer"] if "answer" in ex else answer_text(ex["windows"])
                enc = encode_example(self.tokenizer, frames, ex["timestamps"], ex["query"], answer,
                                     vision=self.vision, max_length=self.spec.max_seq_len, key=ex["key"])
                if "pack_row" in ex:
                    enc["pack_row"] = ex["pack_row"]
                if self.spec.mix:
                    enc["mix"] = ex["mix"]
                out.append(enc)
            except ValueError as e:
                errors.add(f"bad_example: {str(e).splitlines()[0][:200]}", ex["key"])
        return out

    def __iter__(self) -> Iterator[dict]:
        errors = ErrorLog()
        pad = self.tokenizer.pad_token_id
        for raw in self.raw_batches(errors):
            examples = self.encode(raw, errors)
            mix = [ex.pop("mix") for ex in examples] if self.spec.mix else []
            if not examples:
                batch = {"keys": []}
            elif self.spec.packing:
                batch = pack(examples, pad)
            else:
                batch = collate(examples, pad)
            if self.spec.mix:
                batch["mix"] = mix
            batch["data_errors"] = errors.drain()
            yield batch


def check_shards(urls: list[str]) -> None:
    """Local shard paths must exist (a missing one is a clear error, not a silent skip)."""
    missing = [u for u in urls if "://" not in u and not Path(u).is_file()]
    if missing:
        raise VTGError(f"shard not found: {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1
                                                           else "") + "; re-run preprocess or fix train.shards_dir")


def resolve_urls(shards: str | list[str], split: str) -> list[str]:
    """A shard root (-> `list_shards(root, split)`) or an explicit list of shard paths/URLs."""
    urls = list_shards(shards, split) if isinstance(shards, (str, Path)) else list(shards)
    check_shards(urls)
    return urls


def make_loader(spec: StreamSpec, tokenizer, vision: VisionParams, num_workers: int,
                prefetch_factor: int) -> torch.utils.data.DataLoader:
    kw = {"prefetch_factor": prefetch_factor, "persistent_workers": False} if num_workers > 0 else {}
    # Every iterator of a DataLoader draws its base seed from `generator`, by default the global torch RNG: a resumed
    # run, which restores that RNG and then builds its loader, would be one draw ahead of the uninterrupted run
    # (dropout and sampling would differ). The stream's own randomness is seeded apart, so its own generator.
    return torch.utils.data.DataLoader(ShardStream(spec, tokenizer, vision), batch_size=None,
                                       num_workers=num_workers, worker_init_fn=_worker_init,
                                       generator=torch.Generator().manual_seed(spec.seed), **kw)


def _worker_init(worker_id: int) -> None:
    torch.set_num_threads(1)


def read_examples(urls: list[str], tokenizer, vision: VisionParams, limit: int,
                  max_seq_len: int) -> tuple[list[dict], list[tuple[str, str]]]:
    """The first `limit` encoded examples of a shard list, in order, and the errors met (for sanity checks)."""
    spec = StreamSpec(urls=tuple(urls), seed=0, resampled=False, shuffle_buffer=1, micro_batch_size=1,
                      max_seq_len=max_seq_len)
    stream = ShardStream(spec, tokenizer, vision)
    errors = ErrorLog()
    raw = [b[0] for b in islice(stream.raw_batches(errors), limit)]
    return stream.encode(raw, errors), errors.drain()
