"""Find video files by id under the video root, and probe durations (only Charades needs it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # probing corrupt files is expected: no FFmpeg noise
import cv2

from vtg.errors import VTGError

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov")


class VideoIndex:
    """`<root>/**/<video_id><ext>` for the common extensions, built with one directory walk; `extra_roots` are
    further directories a record's own `video_path` may point into (not searched)."""

    def __init__(self, root: str | Path, extra_roots: Sequence[str | Path] = ()):
        self.root = Path(root)
        if not self.root.is_dir():
            raise VTGError(f"{self.root}: video root does not exist; set ingest.video_root=<directory of videos>")
        self.allowed = [os.path.realpath(r) for r in (self.root, *extra_roots)]
        rank = {ext: i for i, ext in enumerate(VIDEO_EXTENSIONS)}
        found: dict[str, tuple[int, str]] = {}
        folders: dict[str, set[str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for name in sorted(filenames):
                stem, ext = os.path.splitext(name)
                if ext.lower() in rank:
                    key = (rank[ext.lower()], os.path.join(dirpath, name))
                    found[stem] = min(found.get(stem, key), key)  # in one folder: .mp4 before .avi ...
                    folders.setdefault(stem, set()).add(key[1])
        self.paths = {stem: Path(p).as_posix() for stem, (_, p) in found.items()}
        self.ambiguous = {stem: sorted(Path(p).as_posix() for p in files) for stem, files in folders.items()
                          if len({os.path.realpath(p) for p in files}) > 1}
        """Ids that name more than one file (in two folders, or `a.mp4` and `a.mkv` in one): which one a record
        means is not known, so none is taken (`vtg.sources.refuse_ambiguous`'s rule)."""

    def locate(self, video_id: str) -> str | None:
        return self.paths.get(video_id)

    def outside_roots(self, path: str) -> str | None:
        """None when `path`, with symlinks and `..` resolved, lies inside the video root or an extra root; else
        the resolved path (the file a record would really read)."""
        real = os.path.realpath(path)
        if any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.allowed):
            return None
        return real

    def __len__(self) -> int:
        return len(self.paths)


def probe_duration(path: str) -> tuple[float | None, str]:
    """(duration in seconds, "") from the container's frame count and fps on the file's timeline
    (`vtg.frames.declared_duration_s`), or (None, why not)."""
    cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            return None, "OpenCV cannot open it (empty, truncated or not a video)"
        frames, fps = cap.get(cv2.CAP_PROP_FRAME_COUNT), cap.get(cv2.CAP_PROP_FPS)
        if not (frames > 0 and fps > 0):
            return None, f"no frame count/fps in the container (frames={frames}, fps={fps})"
        from vtg.frames import declared_duration_s

        return declared_duration_s(int(frames), fps, path), ""
    finally:
        cap.release()
