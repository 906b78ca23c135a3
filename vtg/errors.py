"""User-facing errors: one line that names the file/key and says what to do."""

from __future__ import annotations

import errno
import os


class VTGError(Exception):
    """An error whose message is meant for the user as-is (no traceback needed)."""


class ConfigError(VTGError):
    """Invalid configuration: unknown key, wrong type, out-of-range value, missing file."""


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Write failures that mean "no room": a full disk, a full quota, a file over the size limit."""


NO_SPACE_TEXT = ("No space left on device", "StorageFull", "file write failed", "Disk quota exceeded")
"""How libraries that do not raise OSError say the same: torch.save ("... file write failed"), safetensors
("IoError(Os { code: 28, kind: StorageFull ..."), DeepSpeed re-raising either."""


def no_space(e: BaseException) -> bool:
    """True for a write that failed for lack of room: an `OSError` with a `NO_SPACE_ERRNOS` code, or another
    library's error that says so (`NO_SPACE_TEXT`)."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno in NO_SPACE_ERRNOS
    return any(t in str(e) for t in NO_SPACE_TEXT)


FULL_B = 2**20
"""This little free space or less: the disk is full, a stage refuses to start writing."""
LOW_SPACE_B = 64 * 2**20
"""Less free space than this where a write failed: the failure was the full disk, whatever the library said
(torch.save's short write reads "[enforce fail at inline_container.cc] unexpected pos ...")."""


def out_of_space(e: BaseException, where: str | os.PathLike) -> bool:
    """`no_space(e)`, or the filesystem of `where` has less than `LOW_SPACE_B` free after the failure."""
    if no_space(e):
        return True
    import shutil

    try:
        return shutil.disk_usage(where).free < LOW_SPACE_B
    except OSError:
        return False


def describe_os_error(e: OSError) -> str:
    """One line for an OS-level failure: what failed, where, and what to do."""
    where = e.filename or ""
    if no_space(e):
        folder = os.path.dirname(os.path.abspath(where)) if where else "."
        return (f"no space left on the device writing {where or 'a file'} ({e.strerror}): free space there "
                f"(`df -h {folder}`) and rerun; a stage resumes from its last complete output")
    return f"{e.strerror or type(e).__name__}: {where}" if where else f"{e.strerror or e}"
