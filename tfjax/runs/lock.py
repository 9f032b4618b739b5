"""One training run per workdir: an exclusive lock on `<workdir>/train.lock`.

Two runs on one workdir (a double launch, a requeued job while the first still runs) would
interleave `metrics.jsonl` and both write checkpoints. `train_and_evaluate` therefore holds
`held(workdir)` from before its first write to its return, and a second run stops at once with
a `WorkdirLockedError` naming the holder (host, pid, start time, command).

The OS lock is `filelock.FileLock`'s non-blocking `flock`, which the kernel drops when its
process exits in any way, so a record found with the flock free is a dead run's and is taken
over with a warning. Where flock is kept per host or refused (some NFS mounts, FUSE), the holder
touches the file every `HEARTBEAT_SECONDS` and a record of another host is taken over only once
untouched for `STALE_SECONDS`: its age is read against a file this run stamps on the same
filesystem, never against this host's clock (skewed, it could take over a live run at once), and
a younger record is watched on this host's monotonic clock. Without flock a record of this host
is a live run while its pid runs with the start time recorded (`Holder.pid_start`), so a pid
the kernel gave to another process does not keep the workdir.

filelock's `SoftFileLease` does much of this for its own marker (it takes over at once a holder
of this host that is dead, comparing process start times, and waits out another host's on its
own monotonic clock), but its marker names no start time or command for the refusal, reads a
tfjax record as malformed (taken over only after its grace period, not at once when its process
is gone) and asks every contender to poll for a lease's whole duration; the flock, which answers
at once for a live or dead holder on any filesystem that has it, stays the lock, and the record
its annotation. In a multi-host JAX run process 0 takes the lock and tells the others. The
decoding tools only read a workdir and take no lock. The cases one by one: docs/scale.md, "The
workdir lock".
"""

import contextlib
import dataclasses
import datetime
import errno
import json
import logging
import os
import pathlib
import socket
import sys
import tempfile
import threading
import time

import filelock

from tfjax import errors

log = logging.getLogger(__name__)

LOCK_FILE = "train.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0
RECORD_WAIT_SECONDS = 2.0
# flock errors that mean "this filesystem cannot lock", not "someone holds it".
_NO_LOCKING = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


@dataclasses.dataclass(frozen=True)
class Holder:
    """The run recorded in a lock file."""

    host: str
    pid: int
    started: str
    command: str = ""
    pid_start: str = ""  # the process's start ("<boot id>:<ticks>", Linux), "" where unknown

    def describe(self) -> str:
        command = f", command {self.command}" if self.command else ""
        return f"host {self.host}, pid {self.pid}, started {self.started}{command}"

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        """The holder of a lock file's text; None when it is empty or not a record."""
        try:
            record = json.loads(text)
            return cls(
                str(record["host"]),
                int(record["pid"]),
                str(record["started"]),
                str(record.get("command", "")),
                str(record.get("pid_start", "")),
            )
        except (ValueError, TypeError, KeyError):
            return None


def this_process() -> Holder:
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    command = " ".join(sys.argv)[:200]
    pid = os.getpid()
    return Holder(socket.gethostname(), pid, started, command, process_start(pid) or "")


def process_start(pid: int) -> str | None:
    """When process `pid` of this host started, as "<boot id>:<clock ticks since boot>" (Linux's
    /proc), None where it cannot be read (no such process, another system). Two processes that
    had the same pid have different starts."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 1 :].split()  # the command name may hold spaces and ')'
    return f"{boot}:{int(fields[19])}" if len(fields) > 19 and fields[19].isdigit() else None


def read_holder(workdir: str | os.PathLike) -> Holder | None:
    """The run recorded in `workdir`'s lock file (None: no file, or no run recorded)."""
    try:
        return Holder.parse((pathlib.Path(workdir) / LOCK_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def os_file_lock(path: pathlib.Path, *, on_acquired) -> filelock.BaseFileLock:
    """filelock's non-blocking OS lock on `path`: `acquire()` raises `filelock.Timeout` when
    another process holds it, and an OSError (ENOSYS, ENOLCK, ...) where the filesystem cannot
    lock (no soft fallback: see the module docstring); `on_acquired(fd)` runs with it held."""
    return filelock.FileLock(
        path,
        timeout=0,
        thread_local=False,
        fallback_to_soft=False,
        preserve_lock_file=True,
        on_acquired=on_acquired,
    )


def _pid_alive(pid: int, started: str = "") -> bool:
    """Whether process `pid` of this host runs and, when its start is recorded (`started`,
    from `process_start`) and readable now, is the process that started then, not another one
    the kernel gave the number to since."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        pass
    now = process_start(pid) if started else None
    return now is None or now == started


def _filesystem_time(directory: pathlib.Path) -> float | None:
    """The time `directory`'s filesystem stamps on a file touched now: what a heartbeat's
    `os.utime` writes there (an NFS server stamps its own time), so that a record's age needs
    no other host's clock, nor this one's. None when no file can be made there."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{LOCK_FILE}.", suffix=".clock", dir=directory)
    except OSError:
        return None
    try:
        os.utime(name)
        return os.fstat(fd).st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


class WorkdirLock:
    """The exclusive lock of one workdir; a context manager (`with WorkdirLock(path): ...`).

    Args:
        workdir: an existing directory.
        heartbeat_seconds: how often the holder touches the lock file.
        stale_seconds: how long a record of another host may go untouched before it counts as
            left by a dead run.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        stale_seconds: float = STALE_SECONDS,
    ):
        self.workdir = pathlib.Path(workdir)
        self.path = self.workdir / LOCK_FILE
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_seconds = stale_seconds
        self._lock: filelock.BaseFileLock | None = None
        self._held = False
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> "WorkdirLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        """Takes the lock, or raises `WorkdirLockedError` naming the run that holds it."""
        if self._lock is not None:
            raise RuntimeError(f"{self.path} is already held by this WorkdirLock")
        os_lock = os_file_lock(self.path, on_acquired=self._claim)
        try:
            os_lock.acquire()
        except filelock.Timeout:
            raise self._busy(self._holder_soon()) from None
        except OSError as err:
            if err.errno not in _NO_LOCKING:
                raise self._unusable(err) from err
            log.warning(
                "%s: this filesystem cannot flock (%s); using the record only",
                self.path,
                err.strerror,
            )
            self._claim_unlocked()
            os_lock = None
        self._lock = os_lock
        self._held = True
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name="tfjax-lock", daemon=True)
        self._heartbeat.start()

    def _claim_unlocked(self) -> None:
        """`_claim` where the filesystem cannot flock: the record alone decides."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise self._unusable(err) from err
        try:
            self._claim(fd, flocked=False)
        finally:
            os.close(fd)

    def _unusable(self, err: OSError) -> errors.WorkdirError:
        """The one-line error of a lock file that cannot be opened (a symbolic link, which the
        lock never follows, or a file this user may not write)."""
        if self.path.is_symlink():
            target = os.readlink(self.path)
            what = f"is a symbolic link (to {target}), which the lock does not follow"
        else:
            what = f"cannot be opened ({err.strerror or err})"
        return errors.WorkdirError(
            f"workdir {self.workdir}: its lock file {self.path} {what}; remove it (a run makes "
            "a new one) unless another program uses it, or train in another workdir"
        )

    def _holder_soon(self) -> Holder | None:
        """The holder's record, waiting up to `RECORD_WAIT_SECONDS` for it: a run that has just
        taken the flock writes it a moment later, and the refusal should name it."""
        deadline = time.monotonic() + RECORD_WAIT_SECONDS
        while (holder := read_holder(self.workdir)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return holder

    def _claim(self, fd: int, *, flocked: bool = True) -> None:
        """With the lock file open as `fd` (flocked unless the filesystem cannot): takes over a
        run that is gone or refuses a live one, then writes this process's record."""
        previous = Holder.parse(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
        if previous is not None:
            self._check_gone(fd, previous, flocked=flocked)
        record = json.dumps(dataclasses.asdict(this_process())).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        os.fsync(fd)

    def release(self) -> None:
        """Empties the record and drops the lock; does nothing when not held."""
        if not self._held:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        self._held = False
        with contextlib.suppress(OSError):
            os.truncate(self.path, 0)
        os_lock, self._lock = self._lock, None
        if os_lock is not None:
            os_lock.release()

    def _busy(self, holder: Holder | None) -> errors.WorkdirLockedError:
        who = holder.describe() if holder else "host and pid not written yet"
        return errors.WorkdirLockedError(
            f"workdir {self.workdir} is in use by another training run ({who}): wait for it "
            "to finish or stop it, or train in another workdir"
        )

    def _check_gone(self, fd: int, holder: Holder, *, flocked: bool | None) -> None:
        """Returns if `holder` is a run that is gone (warning that its lock is taken over)."""
        if holder.host != socket.gethostname():
            self._wait_until_stale(fd, holder)
        elif not flocked and _pid_alive(holder.pid, holder.pid_start):
            raise errors.WorkdirLockedError(
                f"{self._busy(holder)}; if pid {holder.pid} is not a training run (its number "
                f"was reused), delete {self.path}"
            )
        log.warning(
            "%s: taking over the lock of a training run that is gone (%s); it stopped "
            "without releasing it (killed, or its machine went down)",
            self.path,
            holder.describe(),
        )

    def _wait_until_stale(self, fd: int, holder: Holder) -> None:
        """Returns once another host's record has gone untouched for `stale_seconds`: at once
        when the filesystem's clock (`_filesystem_time`) says so, else after watching it.

        Raises:
            WorkdirLockedError: if the holder's heartbeat touches the file meanwhile.
        """
        first = os.fstat(fd).st_mtime
        now = _filesystem_time(self.workdir)
        age = None if now is None else now - first
        if age is not None and age > self.stale_seconds:
            return
        log.warning(
            "%s: host %s (pid %d) touched it %s; watching it for %.0f s to see whether that "
            "run is alive",
            self.path,
            holder.host,
            holder.pid,
            "at an unknown time" if age is None else f"{max(age, 0.0):.0f} s ago",
            self.stale_seconds,
        )
        deadline = time.monotonic() + self.stale_seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self.heartbeat_seconds / 2, left))
            if os.fstat(fd).st_mtime != first:
                raise self._busy(holder)  # its heartbeat touched the file: alive

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                os.utime(self.path)
            except OSError:  # e.g. a full disk: the run goes on, the record just ages
                continue


@contextlib.contextmanager
def held(workdir: str | os.PathLike, **options):
    """Holds `workdir`'s lock for a run of one or several JAX processes (process 0 takes it).

    Args:
        workdir: an existing directory.
        **options: `WorkdirLock` options.

    Raises:
        WorkdirLockedError: in every process, when another run holds the lock.
    """
    import jax

    if jax.process_count() == 1:
        with WorkdirLock(workdir, **options):
            yield
        return
    from jax.experimental import multihost_utils

    lock, error = None, None
    if jax.process_index() == 0:
        lock = WorkdirLock(workdir, **options)
        try:
            lock.acquire()
        except Exception as err:  # every process must reach the broadcast below
            error = err
    import numpy as np

    taken = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if error is not None:
        raise error
    if not taken:
        raise errors.WorkdirLockedError(
            f"workdir {workdir} is in use by another training run (process 0's log names it)"
        )
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
