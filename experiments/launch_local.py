"""Run a command as a multi-process JAX job on one machine (tests; machines without a cluster).

    python -m experiments.launch_local --processes=2 --devices_per_process=4 -- \\
        python -m experiments.train --config=configs/base.py:tiny --workdir=runs/two

starts the command `--processes` times. Process i gets `TFJAX_COORDINATOR_ADDRESS` (a free
port on 127.0.0.1 from `portpicker`: nothing listens beyond loopback), `TFJAX_NUM_PROCESSES` and
`TFJAX_PROCESS_ID=i`; `experiments.train` joins the job when it sees them
(`tfjax.parallel.distributed`). `--devices_per_process=N` gives each process N simulated CPU
devices (`--xla_force_host_platform_device_count`); CPU collectives between the processes go
through gloo. Each output line comes back prefixed with `[i] `, stdout to stdout, stderr to
stderr. On a cluster the same command runs without this launcher (see docs/scale.md).

When a process fails, the others get `--grace_seconds` to end on their own (JAX ends them when
it notices a peer is gone), then are killed; the launcher names the process that failed first
and exits with its status (128 + N for a signal N). JAX ends a process whose peer died
natively when it cannot be caught in Python (above all when process 0, which serves the job's
coordination service, dies): its C++ stack trace and Python's thread dump (a hundred lines)
are condensed into one `[i] error: ...` line (`--show_native_aborts` keeps them).

Ctrl-C or SIGTERM to the launcher sends SIGTERM to every process (`experiments.train` then
saves a checkpoint at one agreed step and stops); a second Ctrl-C kills them.
`--timeout_seconds` bounds the whole job (status 124).
Processes die with the launcher, even when it is killed (Linux: PR_SET_PDEATHSIG).
"""

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import portpicker
from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
flags.DEFINE_integer("processes", 2, "Number of processes to start (>= 1).")
flags.DEFINE_integer(
    "devices_per_process",
    0,
    "Simulated CPU devices per process (0: leave XLA_FLAGS as the environment has it).",
)
flags.DEFINE_integer("port", 0, "Coordinator port on 127.0.0.1 (0: pick a free one).")
flags.DEFINE_float("timeout_seconds", 0, "Stop the whole job after this long (0: no limit).")
flags.DEFINE_float(
    "grace_seconds", 10, "After one process fails, how long the others may take to end."
)
flags.DEFINE_bool(
    "show_native_aborts",
    False,
    "Forward the C++ stack trace of a process that JAX's distributed client aborts, instead "
    "of one error line.",
)

TIMEOUT_STATUS = 124  # as timeout(1)
_DEVICE_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")
_PR_SET_PDEATHSIG = 1
# How JAX's distributed client (xla's client.h, jax 0.10) begins the abort of a process whose
# job's coordination service reported an error, and the line its agent logs just before it.
NATIVE_ABORT = "Terminating process because the JAX distributed service detected fatal errors"
_NATIVE_PRELUDE = "Polled an error from coordination service"


def check_port(port: int) -> None:
    """Raises a one-line UsageError unless `port` can be bound on 127.0.0.1."""
    if not 0 < port < 65536:
        raise cli.UsageError(f"--port={port} is not a TCP port: give 1-65535, or 0 for a free one")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is fine
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise cli.UsageError(
                f"port {port} on 127.0.0.1 is in use ({err.strerror}): pick another --port, "
                "or leave it out and a free one is chosen"
            ) from None


def child_env(environ: dict, *, port: int, processes: int, index: int, devices: int) -> dict:
    """The environment of process `index`: the job's TFJAX_* variables and its device count."""
    env = dict(environ)
    env.update(
        TFJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        TFJAX_NUM_PROCESSES=str(processes),
        TFJAX_PROCESS_ID=str(index),
        PYTHONUNBUFFERED="1",  # lines arrive as they are printed
    )
    if devices:
        kept = _DEVICE_FLAG.sub("", env.get("XLA_FLAGS", "")).split()
        env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the launcher dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def describe_status(status: int) -> str:
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


class NativeAborts:
    """The stderr lines of process `index` as the launcher shows them: from JAX's native abort
    on (`NATIVE_ABORT`), one line stands for the rest, and none if the process already said
    why it stops in an `error:` line (a failed collective often comes first)."""

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count
        self.held: list[str] = []  # the agent's line that comes just before an abort
        self.said_error = False
        self.aborted = False

    def feed(self, text: str) -> list[str]:
        """The lines to show for the next line `text` (none, it, or held ones with it)."""
        if self.aborted:
            return []
        if NATIVE_ABORT in text:
            self.aborted, self.held = True, []
            return [] if self.said_error else [self.summary()]
        if _NATIVE_PRELUDE in text:
            self.held.append(text)
            return []
        self.said_error = self.said_error or text.startswith("error: ")
        shown, self.held = [*self.held, text], []
        return shown

    def end(self) -> list[str]:
        """The lines still held when the pipe closes."""
        shown, self.held = self.held, []
        return shown

    def summary(self) -> str:
        return (
            f"error: process {self.index} of {self.count} was ended by JAX's distributed "
            "client: the job's coordination service reported an error, most likely another "
            "process of the job died or lost its connection (the native stack trace is left "
            "out: --show_native_aborts shows it)"
        )


class Job:
    """The started processes, their output forwarders, and how they ended."""

    def __init__(
        self,
        command: list[str],
        processes: int,
        port: int,
        devices: int,
        *,
        condense_aborts: bool = True,
    ):
        self._lock = threading.Lock()
        self.condense_aborts = condense_aborts
        self.procs: list[subprocess.Popen] = []
        for index in range(processes):
            env = child_env(
                os.environ, port=port, processes=processes, index=index, devices=devices
            )
            self.procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # the terminal's Ctrl-C reaches the launcher only
                    preexec_fn=_die_with_parent,
                )
            )
        self.threads = [
            threading.Thread(target=self._forward, args=(pipe, i, out), daemon=True)
            for i, proc in enumerate(self.procs)
            for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
        ]
        # One waiter per process records when it ended: polling every few tens of milliseconds
        # cannot order a process that dies and the peer that notices it and exits soon after.
        self.ended: dict[int, float] = {}  # index -> time.monotonic() when it ended
        self.waiters = [
            threading.Thread(target=self._wait, args=(i,), daemon=True)
            for i in range(len(self.procs))
        ]
        for thread in self.threads + self.waiters:
            thread.start()

    def _wait(self, index: int) -> None:
        self.procs[index].wait()
        with self._lock:
            self.ended[index] = time.monotonic()

    def _forward(self, pipe, index: int, out) -> None:
        """Copies the lines of one pipe of process `index`, prefixed with `[index] `; its
        stderr through a `NativeAborts` filter (`condense_aborts`)."""
        condense = self.condense_aborts and out is sys.stderr
        lines = NativeAborts(index, len(self.procs)) if condense else None
        for line in iter(pipe.readline, b""):
            text = line.decode("utf-8", "replace").rstrip("\n")
            self._write(out, index, lines.feed(text) if lines else [text])
        self._write(out, index, lines.end() if lines else [])

    def _write(self, out, index: int, texts: list[str]) -> None:
        with self._lock:
            for text in texts:
                out.write(f"[{index}] {text}\n")
            out.flush()

    def signal_all(self, signum: int) -> None:
        for index, proc in enumerate(self.procs):
            if index not in self.ended:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    def first_failure(self) -> int | None:
        """The index of the failed process that ended first (lowest index among ties)."""
        with self._lock:
            ended = dict(self.ended)
        failed = [(t, i) for i, t in ended.items() if self.procs[i].returncode != 0]
        return min(failed)[1] if failed else None

    def running(self) -> list[int]:
        """The indices of the processes still running."""
        with self._lock:
            return [i for i in range(len(self.procs)) if i not in self.ended]

    def finish(self) -> None:
        for thread in self.waiters:
            thread.join()
        for thread in self.threads:
            thread.join(timeout=5)


class _Stop:
    """Ctrl-C / SIGTERM to the launcher: SIGTERM to the job, then SIGKILL on the second one."""

    def __init__(self, job: Job):
        self.job, self.count = job, 0
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        self.count += 1
        self.job.signal_all(signal.SIGTERM if self.count == 1 else signal.SIGKILL)


@dataclasses.dataclass
class Outcome:
    failed: int | None = None  # the process that failed first
    timed_out: bool = False
    killed: list[int] = dataclasses.field(default_factory=list)  # by the launcher


def supervise(job: Job, *, timeout: float, grace: float) -> Outcome:
    """Waits for the job to end; after a failure or past `timeout`, kills what still runs."""
    deadline = time.monotonic() + timeout if timeout else None
    outcome, kill_at = Outcome(), None
    while job.running():
        now = time.monotonic()
        if outcome.failed is None:
            outcome.failed = job.first_failure()
            kill_at = None if outcome.failed is None else now + grace
        outcome.timed_out = deadline is not None and now > deadline
        if outcome.timed_out or (kill_at is not None and now > kill_at):
            outcome.killed = job.running()
            job.signal_all(signal.SIGKILL)
            break
        time.sleep(0.05)
    job.finish()
    outcome.failed = job.first_failure()  # every end time known now
    return outcome


def main(argv):
    command = argv[1:]
    if not command:
        raise cli.UsageError(
            "no command to run: put it after --, e.g. python -m experiments.launch_local "
            "--processes=2 -- python -m experiments.train --config=configs/base.py:tiny"
        )
    if FLAGS.processes < 1 or FLAGS.devices_per_process < 0:
        raise cli.UsageError(
            f"--processes={FLAGS.processes} --devices_per_process={FLAGS.devices_per_process}: "
            "need at least 1 process, and 0 (the environment's) or more devices each"
        )
    if FLAGS.port:
        check_port(FLAGS.port)
    port = FLAGS.port or portpicker.pick_unused_port()  # a portserver's, when one runs
    job = Job(
        command,
        FLAGS.processes,
        port,
        FLAGS.devices_per_process,
        condense_aborts=not FLAGS.show_native_aborts,
    )
    stop = _Stop(job)
    outcome = supervise(job, timeout=FLAGS.timeout_seconds, grace=FLAGS.grace_seconds)
    return _report(job, outcome, interrupted=stop.count > 0)


def _report(job: Job, outcome: Outcome, *, interrupted: bool) -> int:
    """Prints one line when the job did not succeed; returns the exit status."""
    count = len(job.procs)
    killed = f"; killed process(es) {outcome.killed}" if outcome.killed else ""
    if outcome.timed_out:
        print(
            f"error: the job of {count} processes ran past --timeout_seconds="
            f"{FLAGS.timeout_seconds:g}{killed}; raise the limit, or rerun to resume",
            file=sys.stderr,
        )
        return TIMEOUT_STATUS
    if outcome.failed is None:
        return 0
    status = job.procs[outcome.failed].returncode
    cause = "after Ctrl-C or SIGTERM" if interrupted else "first"
    fix = (
        "fix what its error line says, then rerun"
        if status == cli.USAGE_STATUS
        else "rerun the same command to resume (experiments.train continues from the last "
        "complete checkpoint)"
    )
    print(
        f"error: process {outcome.failed} of {count} {describe_status(status)} {cause}{killed}"
        f". Its output is on the lines [{outcome.failed}] above; {fix}",
        file=sys.stderr,
    )
    return status if status > 0 else 128 - status


if __name__ == "__main__":
    cli.main(main)
