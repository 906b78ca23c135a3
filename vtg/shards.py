"""The WebDataset sample contract (docs/architecture.md) and a deterministic shard writer.

One sample = one window of one source video: JPEG frames `f000.jpg`, `f001.jpg`, ... and a `json` member
described by `SampleMeta`. The Beam job writes shards with `write_shard`; tests build fixture shards with the
same function (`vtg.testing.shards`), so producers and consumers cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from vtg.io import file_digest

SHARD_PATTERN = "shard-%06d.tar"
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
"""Written by preprocess beside the split folders: counts, lineage, every shard with its samples and sha256,
`data_version` and `shard_contract`."""
SHARD_CONTRACT = 4
"""The sample contract's version, in every sample (`SampleMeta.contract`) and the manifest (`shard_contract`).
1 (before issue 22): frames squashed to `frame_size` x `frame_size`, a short window's frames repeated to fill
the budget, no source frame indices. 2: frames keep their aspect ratio (`stored_frame_size`), no frame is
repeated, and every sample records the source fps and the source frame index of each frame. 3 (issue 24):
`source` is the declared source's id (was `<format>:<annotation path>`) and every sample names its `licence`.
4 (issue 35): a frame's time is its presentation time (the decoder's pts on the file's timeline, `vtg.clock`)
minus the window's start, and window spans, durations and scene cuts are on that clock; before, a time was
`frame_index / source_fps`, wrong for variable-frame-rate video and for a video track that starts late."""
OLDEST_READABLE_CONTRACT = 4
"""Older shards are refused (`check_contract`): their frame times may not be the times the frames were shown."""
CONTRACT_CHANGES = {
    1: "frames squashed to squares, short windows padded with repeated frames, no source frame indices",
    2: "frame times computed as frame index / average fps, not the decoder's presentation times",
    3: "frame times computed as frame index / average fps, not the decoder's presentation times",
}
"""What a shard of each refused contract gets wrong, for the refusal's message."""


class QueryMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str
    windows: list[tuple[float, float]]
    """Ground-truth windows in seconds, relative to the window start."""
    annotation_id: str
    annotation_file: str = ""
    """`<format>:<annotation file under its source's root>` (contract 3)."""
    source: str = ""
    """The query's declared source id (contract 3)."""
    licence: str = ""
    """Its source's licence (contract 3)."""


class SampleMeta(BaseModel):
    """The `json` member of a sample."""

    model_config = ConfigDict(extra="allow")

    key: str
    """`<video_id>-<window_index:04d>` with non `[A-Za-z0-9_-]` characters of the id replaced by `_`: the tar
    member prefix. No dots: plain `webdataset` splits member names at the first dot."""
    video_id: str
    window_index: int
    window_start_s: float
    """Window span in the source video."""
    window_end_s: float
    frame_timestamps: list[float]
    """One per frame actually extracted: its presentation time (the decoder's pts on the file's timeline,
    `vtg.clock`) minus `window_start_s`, in seconds to 4 decimals: the time the frame was shown, on the clock the
    queries' windows use (contract 4)."""
    fps: float
    """Effective sampling rate actually used (frames / window length)."""
    num_frames: int
    queries: list[QueryMeta]
    quality: dict[str, float] = {}
    cluster_id: str = ""
    split: str = ""
    source: str = ""
    """The declared source id of the window's queries (`ingest.sources`), `+`-joined when a video's queries come
    from several (contract 2: `<format>:<annotation file>`)."""
    licence: str = ""
    """Their licence (SPDX id or `LicenseRef-<name>`; an SPDX `AND` expression for several); empty before
    contract 3."""
    preprocess_version: str = ""
    """Code version + params hash of the preprocess run that wrote the sample."""
    contract: int = 1
    """`SHARD_CONTRACT` of the writer (samples without the field predate it: 1)."""
    source_fps: float | None = None
    """Frame rate of the source video (the decoder's)."""
    frame_indices: list[int] | None = None
    """Source frame index of each stored frame, in decode order (provenance: the frame's time is
    `frame_timestamps[i]`, its presentation time, which equals `frame_indices[i] / source_fps` only for a
    constant-rate video whose track starts at 0)."""

    @property
    def duration_s(self) -> float:
        return self.window_end_s - self.window_start_s

    @property
    def source_id(self) -> str:
        """The source's name: the declared id (contract 3), or the annotation format of older samples."""
        if self.contract >= 3:
            return self.source or "unknown"
        return (self.source or "unknown").split(":")[0]


_MEMBER = re.compile(r"^(?P<key>.+)\.(?P<ext>f\d{3}\.jpg|json)$")


def member_key(name: str) -> tuple[str, str]:
    """`vid-0003.f007.jpg` -> (`vid-0003`, `f007.jpg`); also right for keys with dots (`vid.3.f007.jpg`, older
    shards), where wds's first-dot rule would merge the windows of one video."""
    m = _MEMBER.match(name)
    if m:
        return m["key"], m["ext"]
    key, _, ext = name.rpartition(".")
    return key, ext


def encode_jpeg(frame: np.ndarray, quality: int = 90) -> bytes:
    """RGB uint8 HxWx3 -> JPEG bytes (OpenCV, deterministic for the same input)."""
    import cv2

    ok, buf = cv2.imencode(".jpg", frame[:, :, ::-1], [int(cv2.IMWRITE_JPEG_QUALITY), quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return buf.tobytes()


def decode_jpeg(data: bytes) -> np.ndarray:
    """JPEG bytes -> RGB uint8 HxWx3."""
    return decode_jpegs([data])[0]


def decode_jpegs(frames: Sequence[bytes]) -> np.ndarray:
    """A sample's JPEG frames -> RGB uint8 [T, H, W, 3] (one channel flip for the whole clip)."""
    import cv2

    arrs = [cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR) for j in frames]
    if any(a is None for a in arrs):
        raise ValueError("not a decodable JPEG")
    return np.ascontiguousarray(np.stack(arrs)[..., ::-1])


def sample_members(meta: SampleMeta, jpegs: Sequence[bytes]) -> list[tuple[str, bytes]]:
    """Tar members of one sample, in a fixed order."""
    if len(jpegs) != meta.num_frames or len(meta.frame_timestamps) != meta.num_frames:
        raise ValueError(f"{meta.key}: {len(jpegs)} frames, {len(meta.frame_timestamps)} timestamps, "
                         f"num_frames={meta.num_frames}")
    members = [(f"{meta.key}.f{i:03d}.jpg", data) for i, data in enumerate(jpegs)]
    blob = json.dumps(meta.model_dump(mode="json"), sort_keys=True).encode()
    members.append((f"{meta.key}.json", blob))
    return members


def _fixed_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


_TEMPLATE = bytearray(_fixed_info("", 0).tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape"))
_TEMPLATE[148:156] = b" " * 8  # the checksum is computed with its own field as spaces


def _header(name: str, size: int) -> bytes:
    """The USTAR header `tarfile` writes for a member with the fixed metadata, filled in from a template: same
    bytes as `TarInfo.tobuf` (tested) at a twentieth of its cost (a shard has ~17 members per sample)."""
    raw = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(raw) > 100 or size >= 8 ** 11:  # a prefix field or a large size: tarfile's own header
        return _fixed_info(name, size).tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    buf = _TEMPLATE.copy()
    buf[:len(raw)] = raw
    buf[124:136] = b"%011o\0" % size
    buf[148:155] = b"%06o\0" % sum(buf)
    return bytes(buf)


def write_shard(path: str | Path, samples: Iterable[tuple[SampleMeta, Sequence[bytes]]]) -> int:
    """Write samples to a USTAR tar with fixed metadata (mtime 0, uid/gid 0, mode 0o644), byte for byte what
    `tarfile` writes: same input -> same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = size = 0
    try:
        with open(tmp, "wb") as f:
            for meta, jpegs in samples:
                for name, data in sample_members(meta, jpegs):
                    pad = -len(data) % tarfile.BLOCKSIZE
                    f.write(_header(name, len(data)) + data + b"\0" * pad)
                    size += tarfile.BLOCKSIZE + len(data) + pad
                n += 1
            size += 2 * tarfile.BLOCKSIZE  # end-of-archive blocks, then zeros up to a whole record, as tarfile does
            f.write(b"\0" * (2 * tarfile.BLOCKSIZE + -size % tarfile.RECORDSIZE))
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves no partial shard filling the disk
        raise
    tmp.replace(path)
    return n


def list_shards(root: str | Path, split: str) -> list[str]:
    """Sorted shard paths of one split; a missing or empty split is a clear error."""
    from vtg.errors import VTGError

    check_contract(root)
    d = Path(root) / split
    shards = sorted(str(p) for p in d.glob("shard-*.tar"))
    if not shards:
        raise VTGError(f"no shards in {d} (run the preprocess stage first: python -m beam_jobs.preprocess)")
    return shards


def data_version_of(shards: Iterable[dict]) -> str:
    """The data version: sha256 over every shard's path (`<split>/shard-NNNNNN.tar`) and sha256, in path order.

    The one meaning of "data version": preprocess writes it into the manifest; training records it in every
    checkpoint's meta.json and MLflow tags (`vtg.data_version`); evaluation and the lineage CLI read it there."""
    h = hashlib.sha256()
    for s in sorted(shards, key=lambda s: s["path"]):
        h.update(f"{s['path']}:{s['sha256']}\n".encode())
    return h.hexdigest()


def stored_frame_size(width: int, height: int, frame_size: int) -> tuple[int, int]:
    """(width, height) a frame is stored at: about `frame_size`^2 pixels, the source's aspect ratio kept, even
    sides (a square source: exactly `frame_size` x `frame_size`). Each family's processor resizes it to its own
    patch multiples and pixel bounds, as it would the decoded video."""
    scale = frame_size / (width * height) ** 0.5
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


def check_contract(root: str | Path) -> None:
    """Refuse shards whose manifest says they were written under an older (or newer) sample contract."""
    from vtg.errors import VTGError

    manifest = read_manifest(root)
    if manifest is None:
        return  # hand-made shards (tests, the GPU check): samples carry their own contract
    found = int(manifest.get("shard_contract", 1))
    if found < OLDEST_READABLE_CONTRACT:
        raise VTGError(f"{Path(root)}: shards written under sample contract {found} ({CONTRACT_CHANGES.get(found, 'an older layout')}); "
                       f"this version reads contracts {OLDEST_READABLE_CONTRACT}-{SHARD_CONTRACT}: re-run preprocess "
                       "(python -m beam_jobs.preprocess, or dvc repro)")
    if found > SHARD_CONTRACT:
        raise VTGError(f"{Path(root)}: shards written under sample contract {found}, newer than this version's "
                       f"{SHARD_CONTRACT}: update the code")


def read_manifest(root: str | Path) -> dict | None:
    path = Path(root) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def data_sources(root: str | Path, split: str = "train") -> list[dict]:
    """[{source, licence, queries}] of the `split` queries under `root`, from the manifest's per-source counts
    (what a checkpoint trained on these shards was trained on); [] when the manifest has none (older shards)."""
    rows = (read_manifest(root) or {}).get("sources") or []
    return [{"source": r["source"], "licence": r["licence"], "queries": r["kept"][split]}
            for r in rows if r.get("kept", {}).get(split)]


def data_version(root: str | Path) -> str:
    """The data version of the shards under `root`: the manifest's, else computed from the shard files."""
    manifest = read_manifest(root) or {}
    if manifest.get("data_version"):
        return str(manifest["data_version"])
    root = Path(root)
    found = [{"path": p.relative_to(root).as_posix(), "sha256": file_digest(p)}
             for split in SPLITS for p in sorted((root / split).glob("shard-*.tar"))]
    return data_version_of(found)


class ShardProblem(BaseModel):
    """One way a split's shards disagree with the manifest (`verify_shards`)."""

    shard: str
    """`<split>/shard-NNNNNN.tar`, as the manifest names it."""
    kind: str
    """`missing` (listed, not on disk), `unlisted` (on disk, not listed), `size` or `sha256` (content differs)."""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.shard}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


def manifest_shards(manifest: dict, split: str) -> dict[str, dict]:
    """The manifest's entries of one split, by relative path (`<split>/shard-NNNNNN.tar`)."""
    out = {}
    for s in manifest.get("shards") or []:
        if isinstance(s, dict) and s.get("path") and (s.get("split") == split
                                                     or str(s["path"]).startswith(f"{split}/")):
            out[Path(str(s["path"])).as_posix()] = s
    return out


def verify_shards(root: str | Path, split: str, manifest: dict | None = None) -> list[ShardProblem]:
    """Check the shards of `split` under `root` against the manifest preprocess wrote beside them: every listed
    shard present, none unlisted, each with the listed size (when recorded) and sha256.

    Returns the problems (empty: all good). Without a manifest there is nothing to check against: [] (the caller
    decides whether that deserves a warning; hand-made shards, e.g. test fixtures, have none)."""
    root = Path(root)
    manifest = read_manifest(root) if manifest is None else manifest
    if not manifest:
        return []
    listed = manifest_shards(manifest, split)
    found = {p.relative_to(root).as_posix(): p for p in sorted((root / split).glob("shard-*.tar"))}
    problems = [ShardProblem(shard=rel, kind="missing", detail=f"manifest lists {entry.get('samples', '?')} "
                             "samples in it") for rel, entry in sorted(listed.items()) if rel not in found]
    problems += [ShardProblem(shard=rel, kind="unlisted", detail="not in the manifest")
                 for rel in sorted(found) if rel not in listed]
    for rel, path in found.items():
        entry = listed.get(rel)
        if entry is None:
            continue
        size = path.stat().st_size
        want_size = entry.get("size", entry.get("bytes"))
        if want_size is not None and int(want_size) != size:
            problems.append(ShardProblem(shard=rel, kind="size", detail=f"{size} bytes, manifest says {want_size}"))
        elif entry.get("sha256") and file_digest(path) != entry["sha256"]:
            problems.append(ShardProblem(shard=rel, kind="sha256", detail=(
                f"{size} bytes whose sha256 differs from the manifest's (which lists {entry.get('samples', '?')} "
                "samples): truncated or changed after preprocess")))
    return problems
