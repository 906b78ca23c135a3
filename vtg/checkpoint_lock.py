"""One trainer per checkpoint folder: an exclusive `flock` on `<checkpoint root>/.lock`, held by the rank-0 trainer
for its whole run (`training.lifecycle.RunLifecycle` takes it first). The checkpoint layout itself is `vtg.checkpoints`."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from vtg.errors import VTGError, describe_os_error

LOCK_FILE = ".lock"
"""`<checkpoint root>/.lock`: held (`fcntl.flock`) by the rank-0 trainer for its whole run; it holds the pid."""


class CheckpointLock:
    """An exclusive `flock` on `<root>/.lock`: one trainer per checkpoint folder. `acquire` refuses a held lock at
    once with a `VTGError` naming the holder's pid; the kernel drops the lock when the holder dies (even SIGKILL).

    The file is removed on release; an acquirer checks that the file it locked is still the one at the path (not
    one a releasing holder just unlinked, nor one `move_aside` took away with the old root), else tries again."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        self.fd: int | None = None
        self.created: list[Path] = []
        """The folders the lock made (the root and any missing parents, deepest first): released with nothing else
        in them, they go too, so a refused run (missing shards, a bad setting) leaves no empty `checkpoints/`."""

    def _held_here(self) -> bool:
        try:
            return self.fd is not None and os.path.samestat(os.fstat(self.fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def acquire(self) -> CheckpointLock:
        try:
            return self._acquire()
        except VTGError:
            raise
        except OSError as e:  # a full disk, a read-only folder: one line, and no empty lock file left behind
            if self.fd is None:
                with contextlib.suppress(OSError):
                    if self.path.is_file() and self.path.stat().st_size == 0:
                        self.path.unlink()
                self._remove_created()
            raise VTGError(f"cannot lock {self.root}: {describe_os_error(e)}") from None

    def _acquire(self) -> CheckpointLock:
        import fcntl

        for _ in range(50):
            if not self.root.exists():
                missing = [d for d in (self.root, *self.root.parents) if not d.exists()]
                self.root.mkdir(parents=True, exist_ok=True)
                self.created = missing
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise VTGError(f"{self.root} is in use by another trainer (pid {holder} holds {self.path}): wait for "
                               "it to finish or stop it, or set another train.out_dir") from None
            old, self.fd = self.fd, fd
            if self._held_here():
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                except OSError:
                    os.close(fd)
                    self.fd = old
                    raise
                if old is not None:
                    os.close(old)
                return self
            self.fd = old
            os.close(fd)
        raise VTGError(f"could not lock {self.path} (it keeps changing)")

    def refresh(self) -> None:
        """Lock the root again if the held lock file is no longer at the path (the root was moved aside)."""
        if self.fd is not None and not self._held_here():
            self.acquire()

    def release(self) -> None:
        if self.fd is None:
            return
        if self._held_here():
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self.created:
            try:
                folder.rmdir()  # only when empty: nothing but our lock file was ever in it
            except OSError:
                break
        self.created = []

    def __enter__(self) -> CheckpointLock:  # noqa: PYI034
        return self if self.fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_checkpoint_root(root: str | Path) -> CheckpointLock:
    """Take the checkpoint folder's lock (`CheckpointLock`); raises `VTGError` naming the holder if it is held."""
    return CheckpointLock(root).acquire()
