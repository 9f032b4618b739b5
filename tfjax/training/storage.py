"""The workdir's filesystem: a full or read-only disk said in one line, atomic text writes.

A full disk (ENOSPC, EDQUOT) or a read-only mount (EROFS) reaches the code as an `OSError`
from Python's own writes, and as a `ValueError` or `RuntimeError` whose text carries the OS
error (`... No space left on device [os_error_code='28']`) from orbax and tensorstore, often
in a background thread and re-raised later. `storage_problem` recognises both kinds;
`full_disk_error` and `read_only_error` turn them into a `tfjax.errors.StorageError` naming
the filesystem (its mount point) and the fix. `check_writable` probes a directory before a
tool spends minutes on work whose result it could not write.
"""

import errno
import os
import pathlib
import shutil
import tempfile

from tfjax import errors

FULL = "full"
READ_ONLY = "read-only"
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# How tensorstore/orbax/gloo messages carry the OS error (checked in this order).
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os_error_code='28'")
_READ_ONLY_TEXTS = ("Read-only file system", "os_error_code='30'")


def storage_problem(error: BaseException) -> str | None:
    """FULL, READ_ONLY or None: whether `error` (or an error it was raised from) is a full
    disk or a read-only filesystem."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            if error.errno in _FULL_ERRNOS:
                return FULL
            if error.errno == errno.EROFS:
                return READ_ONLY
        if isinstance(error, (OSError, ValueError, RuntimeError)):
            text = str(error)
            if any(t in text for t in _FULL_TEXTS):
                return FULL
            if any(t in text for t in _READ_ONLY_TEXTS):
                return READ_ONLY
        error = error.__cause__ or error.__context__
    return None


def mount_point(path: str | os.PathLike) -> pathlib.Path:
    """The mount point of the filesystem that holds `path` (or would, for a missing path)."""
    path = pathlib.Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def size_text(nbytes: int | float) -> str:
    """Bytes for a message: "0.3 MB", "12 kB", "512 bytes"."""
    if nbytes >= 1e5:
        return f"{nbytes / 1e6:.1f} MB"
    return f"{nbytes / 1e3:.0f} kB" if nbytes >= 1e3 else f"{nbytes:.0f} bytes"


def full_disk_error(
    path: str | os.PathLike,
    doing: str,
    needed_bytes: int | None = None,
    fix: str = "free space and rerun",
) -> errors.StorageError:
    """The one-line `StorageError` for a disk that filled up while `doing` (e.g. "saving step
    30") in `path`; `needed_bytes`: about how much the write needed; `fix` ends the line."""
    mount = mount_point(path)
    free = shutil.disk_usage(mount).free
    needed = f"about {size_text(needed_bytes)} needed, " if needed_bytes else ""
    return errors.StorageError(
        f"no space left on {mount} while {doing} ({needed}{size_text(free)} free); {fix}"
    )


def read_only_error(
    path: str | os.PathLike,
    what: str,
    reason: str = "Read-only file system",
    fix: str = "choose another workdir or make it writable",
) -> errors.StorageError:
    """The one-line `StorageError` for `what` (e.g. "workdir runs/x") that cannot be written,
    worded as the error of a new workdir on a read-only mount (`reason`: the OS's words)."""
    return errors.StorageError(f"cannot write to {what}: {reason} (on {mount_point(path)}); {fix}")


def check_writable(
    directory: str | os.PathLike, what: str, fix: str = "choose another workdir or make it writable"
) -> None:
    """Raises `StorageError` unless a file can be created in `directory` (or in its nearest
    existing parent, where the directory would be made); creates nothing that stays.

    A real file is created and removed, since permission bits say nothing about a read-only
    mount, and nothing at all to root.
    """
    directory = pathlib.Path(directory)
    probe_in = directory
    while not probe_in.exists():
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        return  # a path through a file: the caller's own error says so
    try:
        with tempfile.TemporaryFile(dir=probe_in, prefix=".tfjax-write-probe-"):
            pass
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise read_only_error(directory, what, err.strerror, fix) from err
        if err.errno in _FULL_ERRNOS:
            raise full_disk_error(directory, f"preparing to write {what}") from err
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through a temporary file beside it and a rename, so a
    full disk leaves the old file as it was (and no partial one); raises `StorageError` then."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as err:
        temporary.unlink(missing_ok=True)
        problem = storage_problem(err)
        if problem == FULL:
            raise full_disk_error(path.parent, f"writing {path}", len(text.encode())) from err
        if problem == READ_ONLY:
            raise read_only_error(path.parent, str(path.parent)) from err
        raise
