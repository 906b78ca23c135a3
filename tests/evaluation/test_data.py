import io
import json
import tarfile

from support.eval_fixtures import make_sample, write_fixture_shards

from vtg.queries import ReadStats, iter_examples, iter_spans
from vtg.shards import write_shard


def _append_member(tar_path, name, data: bytes):
    with tarfile.open(tar_path, "a") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_examples_one_per_query_with_source_and_windows(tmp_path):
    root = write_fixture_shards(tmp_path)
    stats = ReadStats()
    exs = list(iter_examples([str(root / "val" / "shard-000000.tar")], stats))
    assert (stats.samples, stats.queries, len(exs)) == (3, 4, 4)
    assert exs[0].key == "valv0.0#0" and exs[1].key == "valv0.0#1" and len(exs[1].windows) == 2
    assert exs[0].frames.shape == (4, 56, 56, 3) and len(exs[0].timestamps) == 4
    assert {ex.source for ex in exs} == {"synthetic", "charades"}
    assert len(list(iter_examples([str(root / "val" / "shard-000000.tar")], ReadStats(), limit=2))) == 2


def test_bad_samples_and_shards_are_skipped_and_counted(tmp_path):
    good = make_sample("v", 0, 10.0, [[(1.0, 2.0)]], "val")
    bad_meta, _ = make_sample("w", 0, 10.0, [[(1.0, 2.0)]], "val")
    shard = tmp_path / "val" / "shard-000000.tar"
    write_shard(shard, [good, (bad_meta, [b"not a jpeg"] * 4)])
    _append_member(shard, "x.0.json", b"{not json")
    _append_member(shard, "y.0.json", json.dumps({"key": "y.0"}).encode())
    broken = tmp_path / "val" / "shard-000001.tar"
    broken.write_bytes(b"\x00garbage" * 10)
    stats = ReadStats()
    exs = list(iter_examples([str(shard), str(broken), str(tmp_path / "missing.tar")], stats))
    assert [ex.key for ex in exs] == ["v.0#0"]
    assert dict(stats.skipped) == {"bad_jpeg": 1, "bad_json": 2, "unreadable_shard": 2}
    span_stats = ReadStats()
    assert list(iter_spans([str(shard)], span_stats)) == [(10.0, [(1.0, 2.0)]), (10.0, [(1.0, 2.0)])]
    assert span_stats.skipped["bad_json"] == 2
