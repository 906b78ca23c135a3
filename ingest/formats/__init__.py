"""One small module per annotation format: `parse(text, name) -> Iterator[(line, raw, RawItem | Rejected)]`."""

from collections.abc import Callable, Iterator

from ingest.formats import activitynet, charades, native, qvhighlights, timelens
from ingest.items import Parsed

Reader = Callable[[str, str], Iterator[Parsed]]

READERS: dict[str, Reader] = {
    "charades": charades.parse,
    "qvhighlights": qvhighlights.parse,
    "activitynet": activitynet.parse,
    "timelens": timelens.parse,
    "jsonl": native.parse,
}

__all__ = ["READERS", "Reader"]
