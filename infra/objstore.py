"""WebDataset shards on S3-compatible object storage (MinIO, S3): publish, list as streamable URLs, cat.

    python -m infra.objstore publish data/shards s3://vtg-shards/shards --versioned   # -> .../shards/<dvc md5>/
    python -m infra.objstore urls s3://vtg-shards/shards/<dvc-hash> train     # one `pipe:` URL per shard
    python -m infra.objstore cat s3://vtg-shards/shards/<dvc-hash>/train/shard-000000.tar > x.tar

WebDataset has no s3:// opener; the URLs are `pipe:` commands that stream one object to stdout, so the
training reader (and `wds.WebDataset`) reads them like local tars, on any node, without a local copy. The
endpoint and credentials come from the standard AWS variables (AWS_ENDPOINT_URL_S3 for MinIO). The data
version in the prefix is the DVC hash of the shard directory, so the DVC remote stays the source of truth.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from vtg.cli_common import run_cli
from vtg.errors import VTGError
from vtg.net import s3_client
from vtg.shards import SHARD_PATTERN

CHUNK = 1 << 20


def split_s3(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise VTGError(f"{url!r}: expected an s3://bucket/prefix URL")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise VTGError(f"{url!r}: no bucket")
    return bucket, key.strip("/")


def client():
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    return s3_client(endpoint)


def dvc_hash(local_root: str | Path, repo: str | Path = ".") -> str:
    """The DVC content hash of a tracked directory (dvc.lock stage output, or `<dir>.dvc` from `dvc add`)."""
    import yaml

    repo, target = Path(repo), Path(local_root).as_posix().rstrip("/")
    outs: list[dict] = []
    if (repo / "dvc.lock").is_file():
        for stage in (yaml.safe_load((repo / "dvc.lock").read_text()) or {}).get("stages", {}).values():
            outs += stage.get("outs", [])
    dvc_file = repo / f"{target}.dvc"
    if dvc_file.is_file():
        outs += [{**o, "path": target} for o in (yaml.safe_load(dvc_file.read_text()) or {}).get("outs", [])]
    for out in outs:
        if Path(out.get("path", "")).as_posix() == target and out.get("md5"):
            return out["md5"].removesuffix(".dir")
    raise VTGError(f"{target} is not a DVC-tracked output here (no dvc.lock stage out or {target}.dvc): "
                   f"run `dvc repro` or `dvc add {target}` first, so the shards have a DVC hash")


def publish(local_root: str | Path, url: str) -> list[str]:
    """Upload every `<split>/shard-*.tar` (and manifest.json) under `local_root` to `url`; returns the keys."""
    bucket, prefix = split_s3(url)
    root = Path(local_root)
    files = sorted(root.glob("*/shard-*.tar")) + [p for p in [root / "manifest.json"] if p.is_file()]
    if not files:
        raise VTGError(f"no shards under {root} (expected {root}/<split>/shard-*.tar)")
    s3, keys = client(), []
    for f in files:
        key = "/".join(filter(None, [prefix, f.relative_to(root).as_posix()]))
        s3.upload_file(str(f), bucket, key)
        keys.append(key)
    return keys


def stream_urls(url: str, split: str) -> list[str]:
    """Sorted `pipe:` URLs, one per shard of `split` under `url`, for WebDataset (or `train.shards`)."""
    bucket, prefix = split_s3(url)
    split_prefix = "/".join(filter(None, [prefix, split])) + "/"
    keys: list[str] = []
    for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=split_prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if _is_shard(o["Key"])]
    if not keys:
        raise VTGError(f"no shards at s3://{bucket}/{split_prefix} (publish them: python -m infra.objstore publish)")
    cat = shlex.join([sys.executable, "-m", "infra.objstore", "cat"])
    return [f"pipe:{cat} s3://{bucket}/{k}" for k in sorted(keys)]


def _is_shard(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    head = SHARD_PATTERN.partition("%")[0]
    return name.startswith(head) and name.endswith(".tar")


def cat(url: str) -> None:
    bucket, key = split_s3(url)
    body = client().get_object(Bucket=bucket, Key=key)["Body"]
    out = sys.stdout.buffer
    for chunk in iter(lambda: body.read(CHUNK), b""):
        out.write(chunk)
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.objstore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("publish", help="upload a local shard root to s3://bucket/prefix")
    p.add_argument("local_root")
    p.add_argument("url")
    p.add_argument("--versioned", action="store_true",
                   help="append the shards' DVC hash to the URL (run in the repo root), so the prefix is the data version")
    u = sub.add_parser("urls", help="print one streamable pipe: URL per shard of a split")
    u.add_argument("url")
    u.add_argument("split")
    c = sub.add_parser("cat", help="stream one object to stdout")
    c.add_argument("url")
    args = parser.parse_args(argv)
    if args.action == "publish":
        url = f"{args.url.rstrip('/')}/{dvc_hash(args.local_root)}" if args.versioned else args.url
        keys = publish(args.local_root, url)
        print(f"published {len(keys)} files to {url}")
    elif args.action == "urls":
        print("\n".join(stream_urls(args.url, args.split)))
    else:
        cat(args.url)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
