"""Joining a multi-process JAX job, and what the processes of one job must agree on.

A job is P processes, each driving its own devices; together they see every device
(`jax.devices()`), and collectives inside a step span all of them (on CPU through gloo). Each
process calls `initialize` once, before any other JAX call, in one of two ways:
  * explicit: the coordinator address (process 0 serves it), the process count and this
    process's id come from tfjax's `TFJAX_COORDINATOR_ADDRESS`, `TFJAX_NUM_PROCESSES` and
    `TFJAX_PROCESS_ID` (`python -m experiments.launch_local` sets them; so can a user), or
    from `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` (the TFJAX_ ones
    win when both are set). Of these JAX itself reads only `JAX_COORDINATOR_ADDRESS` (jax 0.10:
    `jax._src.distributed`); `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` are names tfjax reads,
    spelled as other tools spell them. Every process first checks in with process 0
    (`tfjax.parallel.rendezvous`: the job's shape agreed, the missing processes named after
    `parallel.initialization_timeout_seconds`), then calls `jax.distributed.initialize`;
  * detected: with none of them set (or `JAX_COORDINATOR_ADDRESS` alone, which JAX reads
    itself), `jax.distributed.initialize()` finds the job on the clusters JAX knows
    (`CLUSTERS`: JAX's `jax._src.clusters`).
Sources: the JAX guide "Introduction to multi-controller JAX" (docs.jax.dev, multi_process)
and the docstrings of `jax.distributed.initialize` and
`jax.experimental.multihost_utils.reached_preemption_sync_point` (jax 0.10).

If a process dies, JAX's coordination service notices within `heartbeat_timeout_seconds` and
ends the others; a collective that meets a dead peer fails at once (`peer_lost` words it).
JAX ends a process whose coordinator (process 0) died natively, with a C++ stack trace that
Python cannot catch (`experiments.launch_local` condenses it to one line).
"""

import dataclasses
import logging
import os
from collections.abc import Mapping

from tfjax import errors
from tfjax.parallel import rendezvous

log = logging.getLogger(__name__)

ENV_COORDINATOR = "TFJAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "TFJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "TFJAX_PROCESS_ID"
ENV_VARS = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
JAX_ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
# The environments `jax.distributed.initialize()` detects by itself (jax 0.10).
CLUSTERS = (
    "Cloud TPU VMs (GCE)",
    "TPUs on GKE",
    "Slurm",
    "Open MPI",
    "Kubernetes (a pod of an indexed Job)",
    "MPI through mpi4py (opt-in: cluster_detection_method='mpi4py')",
)
_LOOPBACK = ("127.", "localhost", "[::1]")
RESUME_HINT = "rerun the same command (on every host): it resumes from the last complete checkpoint"


@dataclasses.dataclass(frozen=True)
class Job:
    """Where this process sits in a job; all None: let JAX detect the cluster."""

    coordinator_address: str | None = None  # "host:port" of process 0's coordination service
    num_processes: int | None = None
    process_id: int | None = None
    # The names of the variables it came from, for messages.
    variables: tuple[str, ...] = dataclasses.field(default=ENV_VARS, compare=False)

    @property
    def explicit(self) -> bool:
        return self.coordinator_address is not None

    def describe(self) -> str:
        if not self.explicit:
            return "a job detected from the cluster environment"
        return (
            f"process {self.process_id} of {self.num_processes} with the coordinator at "
            f"{self.coordinator_address}"
        )


def job_from_environ(environ: Mapping[str, str] = os.environ) -> Job:
    """The job the `TFJAX_*` variables describe, else JAX's `JAX_*` ones (all three or none
    of a family set; `JAX_COORDINATOR_ADDRESS` alone leaves the rest to JAX's detection).

    Raises:
        DistributedError: for a partial set, a value that is not a number, or an id >= count.
    """
    names = ENV_VARS
    if not any(environ.get(name, "").strip() for name in ENV_VARS):
        names = JAX_ENV_VARS
    values = {name: environ.get(name, "").strip() for name in names}
    given = [name for name, value in values.items() if value]
    if not given or given == [JAX_ENV_VARS[0]]:  # JAX reads JAX_COORDINATOR_ADDRESS itself
        return Job()
    coordinator, num_processes, process_id = names
    if len(given) < len(names):
        missing = ", ".join(name for name in names if name not in given)
        raise errors.DistributedError(
            f"{', '.join(given)} set but {missing} not: set all of {', '.join(names)} "
            "(python -m experiments.launch_local does), or none to detect the cluster"
        )
    _split_address(values[coordinator], coordinator)
    count, index = (_integer(name, values[name]) for name in (num_processes, process_id))
    if count < 1 or not 0 <= index < count:
        raise errors.DistributedError(
            f"{process_id}={index} with {num_processes}={count}: need "
            f"{num_processes} >= 1 and 0 <= {process_id} < {num_processes}"
        )
    return Job(values[coordinator], count, index, names)


def requested(distributed: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to join a job: `parallel.distributed`, or a launcher's `TFJAX_*` variables, or
    JAX's `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID` (`JAX_COORDINATOR_ADDRESS` alone is not a
    request: JAX's own tools set it for single-process runs too)."""
    names = (*ENV_VARS, *JAX_ENV_VARS[1:])
    return distributed or any(environ.get(name) for name in names)


def _integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.DistributedError(f"{name}={text!r} is not an integer") from None


def _split_address(address: str, name: str = ENV_COORDINATOR) -> tuple[str, int]:
    return rendezvous.split_address(address, name)


def initialize(
    job: Job, *, initialization_timeout_seconds: int = 120, heartbeat_timeout_seconds: int = 100
) -> None:
    """Joins `job`; call once per process, before any other JAX call.

    An explicit job first checks in with process 0 (`tfjax.parallel.rendezvous`), so that a
    process that never comes, an unreachable or unresolvable coordinator, a second process
    with one id, something else on the port or processes told different counts end in one
    line within `initialization_timeout_seconds`, instead of an abort inside JAX.

    Raises:
        DistributedError: the job cannot form (see above), the coordinator cannot start, or no
            cluster was detected.
    """
    import jax

    if jax.distributed.is_initialized():
        return
    log.info("joining %s (timeout %d s)", job.describe(), initialization_timeout_seconds)
    options = dict(
        initialization_timeout=initialization_timeout_seconds,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
    )
    if job.explicit:
        shape = rendezvous.Shape(
            job.coordinator_address, job.num_processes, job.process_id, job.variables
        )
        check_in = rendezvous.serve if job.process_id == 0 else rendezvous.join
        check_in(shape, initialization_timeout_seconds)
        options.update(
            coordinator_address=job.coordinator_address,
            num_processes=job.num_processes,
            process_id=job.process_id,
        )
        if job.coordinator_address.startswith(_LOOPBACK):  # JAX binds to every interface
            options["coordinator_bind_address"] = job.coordinator_address
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
    try:
        jax.distributed.initialize(**options)
    except (RuntimeError, ValueError) as err:  # JaxRuntimeError is a RuntimeError
        raise _start_error(job, err) from err


def _start_error(job: Job, err: Exception) -> errors.DistributedError:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if not job.explicit:
        fix = (
            f"no cluster JAX knows was detected ({', '.join(CLUSTERS)}): run under one, use "
            "python -m experiments.launch_local on one machine, or set "
            f"{', '.join(ENV_VARS)} (or {', '.join(JAX_ENV_VARS)})"
        )
    elif "RPC server" in text:
        fix = f"is port {job.coordinator_address.rpartition(':')[2]} in use? choose a free one"
    else:
        fix = "check that every process got the same coordinator address and process count"
    return errors.DistributedError(f"could not join {job.describe()}: {text}; {fix}")


def barrier(name: str) -> None:
    """Waits until every process of the job has reached `name` (a no-op in one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def preemption_agreed(step: int) -> bool:
    """Multi-process runs: whether every process stops at `step` after a SIGTERM to any one.

    JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM,
    agrees on the next step that every process reaches, and reports True there on all of
    them; a handler installed with `signal.signal` would replace its own, so install none.
    """
    from jax.experimental import multihost_utils

    return multihost_utils.reached_preemption_sync_point(step)


# Words in the errors of a collective or barrier whose peer process is gone.
_PEER_FAILURE = ("gloo", "unavailable", "connection", "coordination", "barrier", "deadline")


def is_peer_failure(error: Exception) -> bool:
    """Whether an error of a multi-process run says a peer process is gone: JAX's own runtime
    errors and the `ValueError`s orbax raises from gloo alike, matched on their words."""
    return any(word in str(error).lower() for word in _PEER_FAILURE)


def peer_lost(error: Exception, *, process: int, count: int, step: int | None):
    """The error to raise when a collective failed because another process of the job died
    (`step` None: before the first step). Its `exit_at_once` tells the entry point to end the
    process without JAX's shutdown, which would wait for the dead process."""
    text = " ".join(str(error).split())[:200] or type(error).__name__
    where = "before the first step" if step is None else f"at step {step}"
    lost = errors.DistributedError(
        f"process {process} of {count} stopped {where}: a collective failed "
        f"({text}); another process of this job died or lost its connection (see its "
        f"output); {RESUME_HINT}"
    )
    lost.exit_at_once = True
    return lost
