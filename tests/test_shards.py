"""The deterministic shard writer (vtg.shards.write_shard) against the standard library's tarfile."""

from __future__ import annotations

import io
import tarfile

import pytest

from vtg.shards import QueryMeta, SampleMeta, sample_members, write_shard


def _tarfile_shard(path, samples) -> None:
    """The reference: tarfile itself, with the same fixed metadata."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for meta, jpegs in samples:
            for name, data in sample_members(meta, jpegs):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))


def _sample(key: str, sizes: list[int]) -> tuple[SampleMeta, list[bytes]]:
    frames = [bytes((i * 7 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    meta = SampleMeta(key=key, video_id=key, window_index=0, window_start_s=0.0, window_end_s=2.0,
                      frame_timestamps=[0.5 * i for i in range(len(sizes))], fps=2.0, num_frames=len(sizes),
                      queries=[QueryMeta(text="a red circle moves", windows=[(0.0, 1.0)], annotation_id="q1")])
    return meta, frames


@pytest.mark.parametrize("samples", [
    [],
    [_sample("v000001-0000", [1, 511, 512, 513, 0])],
    [_sample("v000001-0000", [3000] * 4), _sample("v000002-0001", [10240, 9000])],
    # a member name over 100 bytes (tarfile moves the directory part into the prefix field) and non-ASCII
    [_sample("d" * 60 + "/" + "x" * 60 + "-0000", [700]), _sample("vidéo-0000", [100, 200])],
], ids=["empty", "block-edges", "record-edges", "long-and-non-ascii-names"])
def test_write_shard_is_byte_identical_to_tarfile(tmp_path, samples):
    ours, ref = tmp_path / "ours.tar", tmp_path / "ref.tar"
    assert write_shard(ours, samples) == len(samples)
    _tarfile_shard(ref, samples)
    assert ours.read_bytes() == ref.read_bytes()
    with tarfile.open(ours) as tar:  # and it reads back: names, sizes and contents
        got = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    assert got == [m for meta, jpegs in samples for m in sample_members(meta, jpegs)]
