"""The workdir lock (`tfjax.runs.lock`): one run per workdir, stale locks taken over.

Unit tests of `WorkdirLock` with real flocks: a holder in this process (a second open file
conflicts with the first) or in a child process killed with SIGKILL, stale records of this and
other hosts, a filesystem without flock, and the multi-host hand-over through process 0.
`train_and_evaluate` holding the lock is tested in `tests/test_trainer.py`, two concurrent
training commands in `tests/test_train_cli.py`.
"""

import contextlib
import errno
import fcntl
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from tfjax import errors
from tfjax.runs import lock

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOST = socket.gethostname()


def _write_record(
    workdir: pathlib.Path, host: str, pid: int, age: float = 0.0, **extra: str
) -> None:
    path = workdir / lock.LOCK_FILE
    record = {"host": host, "pid": pid, "started": "2025-01-02 10:00:00 UTC", "command": "x"}
    record.update(extra)
    path.write_text(json.dumps(record))
    if age:
        os.utime(path, (time.time() - age, time.time() - age))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (until the kernel reuses the number)


def test_a_second_lock_is_refused_in_one_line_naming_the_holder(tmp_path):
    with lock.WorkdirLock(tmp_path):
        holder = lock.read_holder(tmp_path)
        assert (holder.host, holder.pid) == (HOST, os.getpid())
        with pytest.raises(errors.WorkdirLockedError) as info:
            lock.WorkdirLock(tmp_path).acquire()
    message = str(info.value)
    assert f"host {HOST}, pid {os.getpid()}" in message and "in use" in message
    assert "\n" not in message
    assert lock.read_holder(tmp_path) is None  # released: the record is emptied
    with lock.WorkdirLock(tmp_path):  # and the lock can be taken again
        pass


def test_a_flock_held_before_its_record_is_written_is_refused(tmp_path):
    # The holder has taken the flock but not yet written host and pid (or a process that is
    # not tfjax holds it): the flock alone must refuse the second run.
    fd = os.open(tmp_path / lock.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(errors.WorkdirLockedError, match="host and pid not written yet"):
            lock.WorkdirLock(tmp_path).acquire()
    finally:
        os.close(fd)
    with lock.WorkdirLock(tmp_path):  # free once that flock is dropped
        pass


def test_a_lock_is_released_on_an_exception(tmp_path):
    with pytest.raises(KeyError), lock.WorkdirLock(tmp_path):
        raise KeyError("boom")
    with lock.WorkdirLock(tmp_path):
        pass


def test_the_kernel_releases_the_lock_of_a_killed_process(tmp_path, caplog):
    code = (
        "import sys, time\n"
        "from tfjax.runs import lock\n"
        f"lock.WorkdirLock({str(tmp_path)!r}).acquire()\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(errors.WorkdirLockedError, match=f"pid {child.pid}"):
            lock.WorkdirLock(tmp_path).acquire()
    finally:
        child.kill()  # SIGKILL: no chance to release; the record stays behind
        child.wait()
    assert lock.read_holder(tmp_path).pid == child.pid
    with caplog.at_level(logging.WARNING), lock.WorkdirLock(tmp_path):
        assert lock.read_holder(tmp_path).pid == os.getpid()
    assert f"pid {child.pid}" in caplog.text and "gone" in caplog.text


def test_a_record_of_a_dead_pid_is_taken_over_with_a_warning(tmp_path, caplog):
    pid = _dead_pid()
    _write_record(tmp_path, HOST, pid)
    with caplog.at_level(logging.WARNING), lock.WorkdirLock(tmp_path):
        assert lock.read_holder(tmp_path).pid == os.getpid()
    assert "taking over" in caplog.text and f"pid {pid}" in caplog.text


def test_another_hosts_stale_record_is_taken_over_at_once(tmp_path, caplog):
    _write_record(tmp_path, "elsewhere", 7, age=600)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING), lock.WorkdirLock(tmp_path, stale_seconds=60.0):
        assert time.monotonic() - start < 5
    assert "host elsewhere" in caplog.text and "taking over" in caplog.text


def test_another_hosts_fresh_record_is_watched_then_taken_over(tmp_path):
    _write_record(tmp_path, "elsewhere", 7)
    start = time.monotonic()
    with lock.WorkdirLock(tmp_path, heartbeat_seconds=0.1, stale_seconds=0.5):
        waited = time.monotonic() - start
    assert 0.5 <= waited < 5


@contextlib.contextmanager
def _beating(path):
    """Touches `path` every 50 ms while the block runs: another host's live heartbeat."""
    stop = threading.Event()

    def heartbeat():
        while not stop.wait(0.05):
            os.utime(path)

    beating = threading.Thread(target=heartbeat)
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()


def test_another_hosts_live_heartbeat_is_refused(tmp_path):
    # flock is per host on some shared filesystems: the record's heartbeat shows the run lives.
    _write_record(tmp_path, "elsewhere", 7)
    with _beating(tmp_path / lock.LOCK_FILE):
        with pytest.raises(errors.WorkdirLockedError, match="host elsewhere, pid 7"):
            lock.WorkdirLock(tmp_path, heartbeat_seconds=0.1, stale_seconds=2.0).acquire()


def test_the_holder_touches_its_record(tmp_path):
    with lock.WorkdirLock(tmp_path, heartbeat_seconds=0.05):
        path = tmp_path / lock.LOCK_FILE
        os.utime(path, (0, 0))
        time.sleep(0.3)
        assert path.stat().st_mtime > time.time() - 5


class _NoFlock:
    """An OS lock whose flock fails as on a filesystem without locks."""

    def __init__(self, path, *, on_acquired):
        del path, on_acquired

    def acquire(self):
        raise OSError(errno.ENOLCK, "No locks available")


def test_without_flock_the_record_decides(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lock, "os_file_lock", _NoFlock)
    _write_record(tmp_path, HOST, os.getppid())  # alive: pytest's parent
    with pytest.raises(errors.WorkdirLockedError, match=r"pid \d+ is not a training run.*delete"):
        lock.WorkdirLock(tmp_path).acquire()
    _write_record(tmp_path, HOST, _dead_pid())
    with caplog.at_level(logging.WARNING), lock.WorkdirLock(tmp_path):
        pass
    assert "cannot flock" in caplog.text and "taking over" in caplog.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start times from /proc")
def test_without_flock_a_pid_reused_by_another_process_is_taken_over(tmp_path, monkeypatch, caplog):
    # The record's pid runs (pytest's parent), but it is not the process that wrote the record:
    # that one started at another time, and the kernel has given its number away since.
    monkeypatch.setattr(lock, "os_file_lock", _NoFlock)
    parent = os.getppid()
    started = lock.process_start(parent)
    assert started and started == lock.process_start(parent)  # a stable start per process
    _write_record(tmp_path, HOST, parent, pid_start=started)
    with pytest.raises(errors.WorkdirLockedError, match=f"pid {parent}"):
        lock.WorkdirLock(tmp_path).acquire()  # the very process: alive
    boot, ticks = started.rsplit(":", 1)
    _write_record(tmp_path, HOST, parent, pid_start=f"{boot}:{int(ticks) + 1}")
    with caplog.at_level(logging.WARNING), lock.WorkdirLock(tmp_path):
        assert lock.read_holder(tmp_path).pid_start == lock.process_start(os.getpid())
    assert "taking over" in caplog.text and f"pid {parent}" in caplog.text


def test_another_hosts_live_record_is_not_judged_by_this_hosts_clock(tmp_path, monkeypatch):
    # This host's clock runs 10 minutes ahead of the file server's: the record, touched a
    # moment ago by the server's clock, would look 10 minutes old by this one's.
    real = time.time
    monkeypatch.setattr(lock.time, "time", lambda: real() + 600.0)
    _write_record(tmp_path, "elsewhere", 7)
    with _beating(tmp_path / lock.LOCK_FILE):
        with pytest.raises(errors.WorkdirLockedError, match="host elsewhere, pid 7"):
            lock.WorkdirLock(tmp_path, heartbeat_seconds=0.1, stale_seconds=2.0).acquire()
    assert [p.name for p in tmp_path.iterdir()] == [lock.LOCK_FILE]  # the clock probe is gone


@pytest.mark.parametrize("target", ["missing", "real"])
def test_a_lock_file_that_is_a_symbolic_link_is_one_line(tmp_path, target):
    (tmp_path / "real").write_text("")
    (tmp_path / lock.LOCK_FILE).symlink_to(target)
    with pytest.raises(errors.WorkdirError) as info:
        lock.WorkdirLock(tmp_path).acquire()
    message = str(info.value)
    assert f"is a symbolic link (to {target})" in message and "remove it" in message
    assert "\n" not in message
    assert not (tmp_path / "missing").exists()  # never followed


_CONTENDER = """
import sys, time
from tfjax import errors
from tfjax.runs import lock
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()  # the start signal: both processes race from here
try:
    held = lock.WorkdirLock(sys.argv[1])
    held.acquire()
except errors.WorkdirLockedError as err:
    print("refused:", err, flush=True)
    sys.exit(2)
print("won", flush=True)
sys.stdin.readline()  # hold the lock until told to stop
held.release()
"""


def test_two_processes_race_for_one_workdir_and_exactly_one_wins(tmp_path):
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, str(tmp_path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        assert [racer.stdout.readline() for racer in racers] == ["ready\n"] * 2
        for racer in racers:
            racer.stdin.write("go\n")
            racer.stdin.flush()
        lines = [racer.stdout.readline().strip() for racer in racers]
        assert sorted(line.split(":")[0] for line in lines) == ["refused", "won"], lines
        winner = racers[lines.index("won")]
        refusal = lines[1 - lines.index("won")]
        assert refusal.startswith(f"refused: workdir {tmp_path} is in use by another training run")
        assert f"host {HOST}, pid {winner.pid}, started " in refusal
        assert racers[lines.index(refusal)].wait(timeout=60) == 2
    finally:
        for racer in racers:
            with contextlib.suppress(OSError):
                racer.stdin.write("stop\n")
                racer.stdin.close()
            racer.wait(timeout=60)
    assert lock.read_holder(tmp_path) is None  # the winner released it


class _Hosts:
    """Stand-ins for `jax.process_count/index` and `broadcast_one_to_all` of process `index`."""

    def __init__(self, monkeypatch, index: int, taken_by_process_0: bool | None = None):
        import jax
        from jax.experimental import multihost_utils

        self.sent = []
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax, "process_index", lambda: index)
        monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", self._broadcast)
        self.taken_by_process_0 = taken_by_process_0

    def _broadcast(self, value):
        self.sent.append(int(value))
        return int(value) if self.taken_by_process_0 is None else int(self.taken_by_process_0)


def test_multi_host_process_0_locks_and_tells_the_others(tmp_path, monkeypatch):
    hosts = _Hosts(monkeypatch, index=0)
    with lock.held(tmp_path):
        assert lock.read_holder(tmp_path).pid == os.getpid()
        with pytest.raises(errors.WorkdirLockedError, match="in use"), lock.held(tmp_path):
            pass
    assert hosts.sent == [1, 0]  # the refused process 0 still answers the broadcast
    assert lock.read_holder(tmp_path) is None


def test_multi_host_other_processes_take_no_lock(tmp_path, monkeypatch):
    _Hosts(monkeypatch, index=1, taken_by_process_0=True)
    with lock.held(tmp_path):
        assert not (tmp_path / lock.LOCK_FILE).exists()
    _Hosts(monkeypatch, index=1, taken_by_process_0=False)
    with pytest.raises(errors.WorkdirLockedError, match="process 0"), lock.held(tmp_path):
        pass
