"""Streaming shards: one example per query, corrupt samples skipped and counted, clear errors, resume position."""

import io
import tarfile
from itertools import islice
from pathlib import Path

import pytest

from training.batching import length_grouped_batches, padding_fraction, token_budget_batches
from training.data import StreamSpec, make_loader, resolve_urls
from vtg.errors import VTGError
from vtg.model.processing import VisionParams
from vtg.shards import member_key


def _batches(urls, tok, n, workers=0, **kw):
    spec = StreamSpec(urls=tuple(urls), seed=3, micro_batch_size=4, shuffle_buffer=8, **kw)
    return list(islice(make_loader(spec, tok, VisionParams(), workers, 2), n))


def test_member_key_keeps_dotted_sample_keys():
    assert member_key("vid.a.3.f007.jpg") == ("vid.a.3", "f007.jpg")
    assert member_key("vid.a.3.json") == ("vid.a.3", "json")


def test_one_example_per_query_and_finite_epoch(shards_dir, tiny_tokenizer):
    urls = resolve_urls(str(shards_dir), "train")
    batches = _batches(urls, tiny_tokenizer, 100, resampled=False)
    keys = [k for b in batches for k in b["keys"]]
    assert len(keys) == len(set(keys)) == 24 * 2  # 24 windows x 2 queries, each exactly once
    assert sum(len(b["data_errors"]) for b in batches) == 0


def _corrupt_copy(src, dst):
    """Copy a shard, breaking one sample's JSON and another sample's first JPEG."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for info in tin.getmembers():
            data = tin.extractfile(info).read()
            if info.name == "trainvid000-0000.json":
                data = b"{not json"
            elif info.name == "trainvid001-0000.f003.jpg":
                data = b"garbage"
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def test_corrupt_samples_are_skipped_and_counted(shards_dir, tiny_tokenizer, tmp_path):
    urls = resolve_urls(str(shards_dir), "train")
    bad = tmp_path / "shard-000000.tar"
    _corrupt_copy(urls[0], bad)
    truncated = tmp_path / "shard-000001.tar"
    truncated.write_bytes(Path(urls[1]).read_bytes()[:5000])
    batches = _batches([str(bad), str(truncated)], tiny_tokenizer, 100, resampled=False)
    errors = [e for b in batches for e in b["data_errors"]]
    reasons = sorted(r.split(":")[0] for r, _ in errors)
    keys = [k for b in batches for k in b["keys"]]
    assert "bad_sample" in reasons  # the broken JSON: the whole window (both queries) skipped
    assert reasons.count("bad_example") == 2  # the bad JPEG: both of its queries
    assert any("shard-000001.tar" in where for _, where in errors)  # the truncated shard's cut-off sample
    assert not any(k.startswith(("trainvid000-0000#", "trainvid001-0000#")) for k in keys)
    assert len(keys) >= 2 * 10  # the rest of the good shard still trains
    assert any("trainvid000-0000" in where for _, where in errors)


def test_missing_shard_is_a_clear_error(shards_dir, tmp_path):
    with pytest.raises(VTGError, match="shard not found: .*nope.tar"):
        resolve_urls([str(tmp_path / "nope.tar")], "train")
    with pytest.raises(VTGError, match="no shards in .*preprocess"):
        resolve_urls(str(tmp_path), "train")


def test_token_budget_batches_put_short_sequences_in_bigger_batches():
    exs = [{"n_tokens": n} for n in [10] * 8 + [40] * 4]
    sizes = [len(b) for b in token_budget_batches(iter(exs), max_batch=8, token_budget=80)]
    assert sizes == [8, 2, 2]
    assert [len(b) for b in token_budget_batches(iter(exs), max_batch=5, token_budget=0)] == [5, 5, 2]


def test_split_by_node_gives_disjoint_streams(shards_dir, tiny_tokenizer, monkeypatch):
    urls = resolve_urls(str(shards_dir), "train")
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        seen.append({k for b in _batches(urls, tiny_tokenizer, 100, resampled=False) for k in b["keys"]})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 48


@pytest.mark.parametrize(("workers", "groups"), [(0, 0), (2, 0), (0, 3), (2, 3)])
def test_resume_position_reproduces_the_stream(shards_dir, tiny_tokenizer, workers, groups):
    urls = resolve_urls(str(shards_dir), "train")
    full = [b["keys"] for b in _batches(urls, tiny_tokenizer, 9, workers, length_groups=groups)]
    for k in (4, 5):
        rest = [b["keys"] for b in _batches(urls, tiny_tokenizer, 9 - k, workers, skip_batches=k,
                                            length_groups=groups)]
        assert rest == full[k:]


def test_length_groups_cut_padding_keep_every_example_and_shuffle_the_batches():
    import random

    rng = random.Random(0)
    exs = [{"key": f"k{i}", "n_tokens": rng.choice([40, 60, 90, 150, 300])} for i in range(480)]
    plain = list(token_budget_batches(iter(exs), max_batch=8, token_budget=0))
    grouped = list(length_grouped_batches(iter(exs), 8, 0, 6, random.Random(1)))
    again = list(length_grouped_batches(iter(exs), 8, 0, 6, random.Random(1)))
    assert [[e["key"] for e in b] for b in grouped] == [[e["key"] for e in b] for b in again]  # deterministic
    assert sorted(e["key"] for b in grouped for e in b) == sorted(e["key"] for e in exs)  # each example once
    assert padding_fraction(iter(plain))[0] > 0.5 and padding_fraction(iter(grouped))[0] < 0.15
    firsts = [b[0]["n_tokens"] for b in grouped[:6]]  # one group's batches, not in length order
    assert firsts != sorted(firsts)
    budget = list(length_grouped_batches(iter(exs), 8, 600, 6, random.Random(1)))
    assert all(max(e["n_tokens"] for e in b) * len(b) <= 600 or len(b) == 1 for b in budget)
    assert list(length_grouped_batches(iter(exs), 8, 0, 0, random.Random(1))) == plain  # 0: stream order
