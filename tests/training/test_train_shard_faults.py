"""Shards checked against the manifest before step 1 (truncated, removed, unlisted shard: one clear error naming
it; no manifest: a warning, and training goes on), a read error mid-run reported once per shard per pass with what
was lost, and one trainer per checkpoint folder."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from itertools import islice
from pathlib import Path

import pytest
from support.train_fixtures import train_config

from training.data import StreamSpec, make_loader
from training.sanity import SanityError
from training.sft import train
from vtg.errors import VTGError
from vtg.io import file_digest
from vtg.model.processing import VisionParams
from vtg.shards import MANIFEST, SHARD_CONTRACT, SPLITS, verify_shards


def with_manifest(src: Path, dst: Path) -> Path:
    """A copy of the fixture shards with the manifest preprocess would write beside them."""
    shutil.copytree(src, dst)
    shards = []
    for split in SPLITS:
        for p in sorted((dst / split).glob("shard-*.tar")):
            import tarfile

            with tarfile.open(p) as t:
                n = len({m.name.split(".")[0] for m in t.getmembers()})
            shards.append({"split": split, "path": p.relative_to(dst).as_posix(), "samples": n,
                           "sha256": file_digest(p)})
    (dst / MANIFEST).write_text(json.dumps({"shards": shards, "data_version": "v-test", "shard_contract": SHARD_CONTRACT}))
    return dst


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_verify_shards_names_every_kind_of_problem(shards_dir, tmp_path):
    root = with_manifest(shards_dir, tmp_path / "shards")
    assert verify_shards(root, "train") == []
    truncate(root / "train/shard-000001.tar")
    (root / "train/shard-000000.tar").unlink()
    shutil.copy(root / "val/shard-000000.tar", root / "train/shard-000007.tar")
    got = {(p.shard, p.kind) for p in verify_shards(root, "train")}
    assert got == {("train/shard-000000.tar", "missing"), ("train/shard-000001.tar", "sha256"),
                   ("train/shard-000007.tar", "unlisted")}
    assert verify_shards(root, "val") == []
    assert verify_shards(shards_dir, "train") == []  # no manifest: nothing to check against


def test_truncated_shard_is_a_clear_error_before_step_1(shards_dir, tmp_path):
    root = with_manifest(shards_dir, tmp_path / "shards")
    truncate(root / "train/shard-000001.tar")
    with pytest.raises(SanityError) as e:
        train(train_config(root, tmp_path / "ck"))
    msg = str(e.value)
    assert "\n" not in msg and "train/shard-000001.tar" in msg and "sha256" in msg
    assert "preprocess" in msg and "dvc checkout" in msg
    assert not (tmp_path / "ck").exists()  # stopped before the model, nothing written


def test_removed_shard_is_a_clear_error(shards_dir, tmp_path):
    root = with_manifest(shards_dir, tmp_path / "shards")
    (root / "train/shard-000000.tar").unlink()
    with pytest.raises(SanityError, match=r"shard train/shard-000000\.tar: missing .*re-run preprocess.*dvc checkout"):
        train(train_config(root, tmp_path / "ck"))


def test_fixture_shards_without_manifest_warn_and_train(shards_dir, tmp_path, caplog):
    assert not (shards_dir / MANIFEST).exists()
    with caplog.at_level(logging.WARNING):
        summary = train(train_config(shards_dir, tmp_path / "ck", "train.max_steps=2", "train.save_every=2"))
    assert summary["step"] == 2
    assert any(MANIFEST in r.getMessage() and "cannot be checked" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "ck" / ".lock").exists()  # the folder lock is released when the run ends


def test_read_error_mid_run_is_one_report_per_shard_pass_with_what_was_lost(shards_dir, tiny_tokenizer, tmp_path):
    root = with_manifest(shards_dir, tmp_path / "shards")
    bad = root / "train/shard-000001.tar"
    truncate(bad, 0.3)
    urls = (str(root / "train/shard-000000.tar"), str(bad))
    spec = StreamSpec(urls=urls, seed=3, micro_batch_size=4, shuffle_buffer=8, resampled=False)
    batches = list(islice(make_loader(spec, tiny_tokenizer, VisionParams(), 0, 2), 100))
    errors = [e for b in batches for e in b["data_errors"]]
    assert len(errors) == 1, errors  # one report for the shard, not one per sample or member
    reason, where = errors[0]
    assert where == str(bad) and reason.startswith("unreadable_shard")
    read = int(reason.split("read ")[1].split(" samples")[0])
    assert 0 < read < 12
    assert f"{12 - read} of its 12 samples lost" in reason and "last good key trainvid0" in reason
    keys = {k.split("#")[0] for b in batches for k in b["keys"]}
    assert len(keys) == 12 + read  # everything before the error point still trains

    spec = StreamSpec(urls=urls, seed=3, micro_batch_size=4, shuffle_buffer=8, resampled=True)
    batches = list(islice(make_loader(spec, tiny_tokenizer, VisionParams(), 0, 2), 40))  # several passes
    errors = [e for b in batches for e in b["data_errors"]]
    passes = sum(1 for b in batches for k in b["keys"]) / (2 * (12 + read))
    assert 1 <= len(errors) <= passes + 1  # once per shard per pass


def _hand_written_shard(root: Path, samples) -> tuple[str, ...]:
    from vtg import shards

    path = root / "train" / (shards.SHARD_PATTERN % 0)
    shards.write_shard(path, samples)
    return (str(path),)


def test_a_query_without_a_window_is_skipped_and_counted_and_the_rest_of_its_window_trains(tiny_tokenizer, tmp_path):
    """A hand-written shard whose query has no ground-truth window (`windows: []`, which the shard contract admits):
    that query is reported as bad data (`bad_query`, with its key) and skipped; the window's other query and every
    other window train. (Before: a bare IndexError from the answer text stopped the run.)"""
    import numpy as np
    from support.train_fixtures import synthetic_window

    rng = np.random.default_rng(0)
    samples = [synthetic_window(rng, f"trainvid{i:03d}-0000", "train") for i in range(4)]
    samples[1][0].queries[0].windows = []
    urls = _hand_written_shard(tmp_path / "shards", samples)
    spec = StreamSpec(urls=urls, seed=3, micro_batch_size=4, shuffle_buffer=0, resampled=False)
    batches = list(make_loader(spec, tiny_tokenizer, VisionParams(), 0, 2))
    errors = [e for b in batches for e in b["data_errors"]]
    keys = sorted(k for b in batches for k in b["keys"])
    assert len(errors) == 1 and errors[0][0].startswith("bad_query: IndexError")
    assert errors[0][1].endswith(":trainvid001-0000#0")
    assert "trainvid001-0000#1" in keys and "trainvid001-0000#0" not in keys and len(keys) == 7


def test_a_stream_that_gives_no_example_stops_with_an_error_instead_of_spinning(tiny_tokenizer, tmp_path,
                                                                              monkeypatch):
    """Shards whose every sample is broken (frames that are not JPEG), read by a stream that resamples (the default):
    before, the loader skipped them forever and training never took a step; now `BAD_RUN_LIMIT` samples in a row
    without an example stop it with one error that names the last bad sample and what to do."""
    from support.train_fixtures import write_undecodable_shard

    from training import data

    monkeypatch.setattr(data, "BAD_RUN_LIMIT", 12)
    urls = (str(write_undecodable_shard(tmp_path / "shards")),)
    spec = StreamSpec(urls=urls, seed=3, micro_batch_size=4, shuffle_buffer=0, resampled=True)
    with pytest.raises(VTGError, match=r"^12 training samples in a row gave no example \(last: bad_sample: .*"
                                       r"trainvid00\d-0000\): the shards past this point are broken; re-run preprocess"):
        next(iter(make_loader(spec, tiny_tokenizer, VisionParams(), 0, 2)))


HOLDER = textwrap.dedent("""
    import sys, time
    from vtg.checkpoint_lock import lock_checkpoint_root
    lock = lock_checkpoint_root(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_second_trainer_on_a_locked_checkpoint_folder_is_refused(shards_dir, tmp_path):
    out = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(VTGError, match=rf"in use by another trainer \(pid {holder.pid} holds"):
            train(train_config(shards_dir, out))
        assert not any(out.glob("step-*"))
    finally:
        holder.kill()
        holder.wait()
