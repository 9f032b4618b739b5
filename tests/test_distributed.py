"""Joining a multi-process job (`tfjax.parallel.distributed`) and the local launcher's pieces.

Fast checks in this process; the processes themselves are started in tests/test_multihost.py.
"""

import socket
import subprocess
import sys

import jax
import pytest

from experiments import cli, launch_local
from tfjax import errors
from tfjax.parallel import distributed, strategies

ADDRESS = "127.0.0.1:12355"


def _environ(address=ADDRESS, count="2", index="1") -> dict:
    values = {
        distributed.ENV_COORDINATOR: address,
        distributed.ENV_NUM_PROCESSES: count,
        distributed.ENV_PROCESS_ID: index,
    }
    return {k: v for k, v in values.items() if v is not None}


def test_job_comes_from_all_three_variables_or_from_the_cluster():
    assert distributed.job_from_environ(_environ()) == distributed.Job(ADDRESS, 2, 1)
    assert distributed.job_from_environ({}) == distributed.Job()  # JAX detects the cluster
    assert not distributed.Job().explicit
    assert distributed.requested(False, _environ()) and distributed.requested(True, {})
    assert not distributed.requested(False, {"TFJAX_PROCESS_ID": ""})


@pytest.mark.parametrize(
    "environ, message",
    [
        (_environ(count=None), "TFJAX_NUM_PROCESSES not"),
        (_environ(address=None, count=None), "set all of"),
        (_environ(index="one"), "TFJAX_PROCESS_ID='one' is not an integer"),
        (_environ(index="2"), "0 <= TFJAX_PROCESS_ID < TFJAX_NUM_PROCESSES"),
        (_environ(count="0", index="0"), "TFJAX_NUM_PROCESSES >= 1"),
        (_environ(address="127.0.0.1"), "is not host:port"),
        (_environ(address="host:99999"), "is not host:port"),
    ],
)
def test_bad_launch_variables_are_one_line_errors(environ, message):
    with pytest.raises(errors.DistributedError, match=message) as raised:
        distributed.job_from_environ(environ)
    assert "\n" not in str(raised.value)


def test_a_missing_coordinator_is_a_one_line_error_not_a_hang():
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    job = distributed.job_from_environ(_environ(address=f"127.0.0.1:{port}"))
    collectives = jax.config.jax_cpu_collectives_implementation
    with pytest.raises(errors.DistributedError, match="did not answer within 1 s") as raised:
        distributed.initialize(job, initialization_timeout_seconds=1)  # before any JAX call
    assert "process 0" in str(raised.value) and "\n" not in str(raised.value)
    assert not jax.distributed.is_initialized()
    assert jax.config.jax_cpu_collectives_implementation == collectives  # nothing was set


def test_start_errors_name_the_fix():
    job = distributed.Job(ADDRESS, 2, 0)
    busy = distributed._start_error(job, RuntimeError("UNKNOWN: Failed to start RPC server"))
    assert "is port 12355 in use?" in str(busy)
    undetected = distributed._start_error(distributed.Job(), ValueError("coordinator_address"))
    assert "launch_local" in str(undetected) and "TFJAX_COORDINATOR_ADDRESS" in str(undetected)


def test_a_failed_collective_names_the_dead_peer_and_the_rerun():
    gloo = RuntimeError("UNKNOWN: Gloo all-reduce failed: Read error\nConnection reset by peer")
    assert distributed.is_peer_failure(gloo)
    assert not distributed.is_peer_failure(RuntimeError("RESOURCE_EXHAUSTED: out of memory"))
    text = str(distributed.peer_lost(gloo, process=0, count=2, step=7))
    assert text.startswith("process 0 of 2 stopped at step 7: a collective failed")
    assert "rerun the same command" in text and "\n" not in text


# What orbax's `sync_global_processes` raised in a survivor while its peer was killed mid-save.
ORBAX_GLOO = (
    "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:589] Read error "
    "[127.0.0.1]:28785: Connection reset by peer"
)


@pytest.mark.parametrize("kind", [ValueError, RuntimeError, jax.errors.JaxRuntimeError])
def test_every_collective_failure_in_the_watched_run_is_one_distributed_error(monkeypatch, kind):
    from tfjax.runs import loop as loop_lib
    from tfjax.runs import trainer

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    loop = loop_lib.Loop.__new__(loop_lib.Loop)  # only its step is read
    loop.step = 12
    with pytest.raises(errors.DistributedError) as raised, trainer._peers_watched(loop):
        raise kind(ORBAX_GLOO)
    text = str(raised.value)
    assert text.startswith("process 0 of 2 stopped at step 12: a collective failed (UNKNOWN: Gloo")
    assert raised.value.exit_at_once
    with pytest.raises(errors.DistributedError, match="stopped before the first step"):
        with trainer._peers_watched():
            raise ValueError(ORBAX_GLOO)
    for other in (ValueError("shapes (2,) and (3,) differ"), errors.ConfigError("connection")):
        with pytest.raises(type(other)) as raised, trainer._peers_watched(loop):
            raise other
        assert raised.value is other  # not a peer's death: passes unchanged


def test_a_lost_peer_skips_waiting_for_the_checkpoint_save(tmp_path, monkeypatch):
    from tfjax.training import checkpointing

    checkpointer = checkpointing.Checkpointer(tmp_path)
    closed = []
    monkeypatch.setattr(checkpointer, "close", lambda: closed.append(True))
    lost = distributed.peer_lost(ValueError(ORBAX_GLOO), process=1, count=2, step=3)
    with pytest.raises(errors.DistributedError), checkpointer:
        raise lost
    assert not closed
    with pytest.raises(ValueError), checkpointer:
        raise ValueError("any other error")
    assert closed == [True]


def test_the_entry_point_ends_at_once_after_a_lost_peer(tmp_path):
    """One line, status 2, and no interpreter shutdown (where JAX would wait for the peer)."""
    script = (
        "import atexit\n"
        "from experiments import cli\n"
        "from tfjax.parallel import distributed\n"
        "atexit.register(lambda: print('shutdown ran', flush=True))\n"
        "def entry(argv):\n"
        "    raise distributed.peer_lost(ValueError('Gloo AllGather failed'), process=0,"
        " count=2, step=4)\n"
        "cli.main(entry, compilation_cache=False, argv=['tool'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: process 0 of 2 stopped at step 4")
    assert "shutdown ran" not in done.stdout


def test_one_process_feeds_every_row_of_the_batch():
    assert strategies.create("pmap").host_rows(16) == slice(0, 16)
    assert strategies.create("sharded", fsdp=2).host_rows(16) == slice(0, 16)
    with pytest.raises(errors.ConfigError, match="divisible by the number of devices"):
        strategies.create("pmap").host_rows(12)


def test_pmap_checkpoint_state_is_replicated_without_the_device_axis():
    strategy = strategies.create("pmap")
    state = strategy.put_state({"w": jax.numpy.arange(6.0).reshape(2, 3)})
    saved = strategy.checkpoint_state(state)["w"]
    assert saved.shape == (2, 3) and saved.sharding.is_fully_replicated
    assert len(saved.sharding.device_set) == jax.device_count()
    target = strategy.restore_target(jax.eval_shape(lambda: {"w": saved}))["w"]
    assert target.sharding == saved.sharding
    again = strategy.put_state({"w": saved})["w"]  # a restored state goes back on every device
    assert again.shape == (jax.device_count(), 2, 3)


def test_launcher_environment_replaces_the_device_count():
    environ = {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8", "A": "b"}
    env = launch_local.child_env(environ, port=555, processes=3, index=2, devices=4)
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=4"
    assert env["TFJAX_COORDINATOR_ADDRESS"] == "127.0.0.1:555"
    assert (env["TFJAX_NUM_PROCESSES"], env["TFJAX_PROCESS_ID"], env["A"]) == ("3", "2", "b")
    kept = launch_local.child_env(environ, port=555, processes=3, index=0, devices=0)
    assert kept["XLA_FLAGS"] == environ["XLA_FLAGS"]


def test_launcher_refuses_a_port_in_use_and_reports_signals():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(cli.UsageError, match=r"port \d+ on 127.0.0.1 is in use"):
            launch_local.check_port(sock.getsockname()[1])
    with pytest.raises(cli.UsageError, match="not a TCP port"):
        launch_local.check_port(70000)
    assert launch_local.describe_status(-9) == "was killed by SIGKILL"
    assert launch_local.describe_status(2) == "exited with status 2"


_DIE_THEN_NOTICE = """
import os, pathlib, signal, sys, time
dead = pathlib.Path(sys.argv[1])
if os.environ["TFJAX_PROCESS_ID"] == "1":
    dead.touch()
    os.kill(os.getpid(), signal.SIGKILL)
while not dead.exists():
    time.sleep(0.001)
time.sleep(0.02)  # a peer that notices the death and exits soon after it
sys.exit(2)
"""


def test_launcher_names_the_process_that_died_not_the_peer_that_noticed(tmp_path):
    """Process 1 is killed; process 0 exits 20 ms later, inside one polling interval: the
    launcher still names process 1 and exits with its status."""
    command = [sys.executable, "-m", "experiments.launch_local", "--processes=2", "--"]
    command += [sys.executable, "-c", _DIE_THEN_NOTICE, str(tmp_path / "dead")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert "error: process 1 of 2 was killed by SIGKILL first." in result.stderr, result.stderr
    assert result.returncode == 128 + 9


_NATIVE_ABORT = """
import os, pathlib, signal, sys, time
ready = pathlib.Path(sys.argv[1])
if os.environ["TFJAX_PROCESS_ID"] == "0":
    while not ready.exists():
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
ready.touch()
print("a line before", file=sys.stderr, flush=True)
time.sleep(0.2)  # process 0 is dead: JAX's client in this one ends it natively, like this
lines = [
    "E1207 01:49:07.121395   17727 coordination_service_agent.cc:289] Polled an error from "
    "coordination service (this can be an error from this or another task).",
    "F1207 01:49:07.121439   17727 client.h:80] Terminating process because the JAX "
    "distributed service detected fatal errors. This most likely indicates that another task "
    "died; see the other task logs for more details.",
    "*** Check failure stack trace: ***",
    *[f"    @     0x7f307fc4063{i}  frame {i}" for i in range(10)],
    "Fatal Python error: Aborted",
]
print("\\n".join(lines), file=sys.stderr, flush=True)
os.abort()
"""


@pytest.mark.parametrize("shown", [False, True])
def test_launcher_condenses_the_native_abort_of_a_peer_of_a_dead_process_0(tmp_path, shown):
    """Process 0 is killed; JAX's client aborts process 1 with a C++ stack trace (imitated
    here; tests/test_multihost.py kills a real one): the launcher forwards one line for it."""
    command = [sys.executable, "-m", "experiments.launch_local", "--processes=2"]
    command += ["--show_native_aborts"] * shown
    command += ["--", sys.executable, "-c", _NATIVE_ABORT, str(tmp_path / "ready")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 128 + 9, result.stderr
    assert lines[-1].startswith("error: process 0 of 2 was killed by SIGKILL first."), lines
    assert "[1] a line before" in lines
    assert ("[1] Fatal Python error: Aborted" in lines) is shown
    assert any("Polled an error" in line for line in lines) is shown
    condensed = [line for line in lines if line.startswith("[1] error:")]
    assert (
        condensed == []
        if shown
        else condensed
        == [
            "[1] error: process 1 of 2 was ended by JAX's distributed client: the job's "
            "coordination service reported an error, most likely another process of the job died "
            "or lost its connection (the native stack trace is left out: --show_native_aborts "
            "shows it)"
        ]
    )
    assert len(lines) == (16 if shown else 3), lines


def test_the_launcher_shows_one_line_for_a_native_abort_and_none_after_an_error_line():
    prelude = "E1207 01:49:07 1 agent.cc:289] Polled an error from coordination service (...)"
    abort = f"F1207 01:49:07 1 client.h:80] {launch_local.NATIVE_ABORT}. This most likely ..."
    stack = [
        "*** Check failure stack trace: ***",
        "    @ 0x7f frame",
        "Fatal Python error: Aborted",
    ]
    lines = launch_local.NativeAborts(1, 2)
    shown = [kept for text in ["a", prelude, abort, *stack] for kept in lines.feed(text)]
    assert shown == ["a", lines.summary()] and lines.end() == []
    assert lines.summary().startswith("error: process 1 of 2 was ended by JAX's distributed")
    lines = launch_local.NativeAborts(1, 2)  # a process that said why it stops, then aborts
    said = ["error: process 1 of 2 stopped at step 4: a collective failed (...)"]
    shown = [kept for text in [*said, prelude, abort, *stack] for kept in lines.feed(text)]
    assert shown == said
    lines = launch_local.NativeAborts(0, 2)  # the agent's line without an abort is kept
    assert lines.feed(prelude) == [] and lines.feed("b") == [prelude, "b"]
    assert lines.feed(prelude) == [] and lines.end() == [prelude]


def _jax_environ(address=ADDRESS, count="2", index="1") -> dict:
    values = dict(zip(distributed.JAX_ENV_VARS, (address, count, index), strict=True))
    return {k: v for k, v in values.items() if v is not None}


def test_jax_own_variables_describe_a_job_and_tfjax_ones_win():
    assert distributed.job_from_environ(_jax_environ()) == distributed.Job(ADDRESS, 2, 1)
    assert distributed.requested(False, _jax_environ())
    both = {**_jax_environ(), **_environ(address="10.0.0.1:9", count="4", index="3")}
    assert distributed.job_from_environ(both) == distributed.Job("10.0.0.1:9", 4, 3)
    # The coordinator alone: JAX reads it itself and detects the rest; no job is requested.
    alone = _jax_environ(count=None, index=None)
    assert distributed.job_from_environ(alone) == distributed.Job()
    assert not distributed.requested(False, alone)


def test_jax_itself_reads_only_the_coordinator_of_the_jax_family():
    """docs/scale.md: JAX_NUM_PROCESSES and JAX_PROCESS_ID are tfjax's names, not JAX's."""
    import inspect

    from jax._src import distributed as jax_distributed

    source = inspect.getsource(jax_distributed)
    assert "'JAX_COORDINATOR_ADDRESS'" in source
    assert not any(name in source for name in distributed.JAX_ENV_VARS[1:])


@pytest.mark.parametrize(
    "environ, message",
    [
        (_jax_environ(index=None), "JAX_PROCESS_ID not"),
        (_jax_environ(address=None), "set all of JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES"),
        (_jax_environ(count="two"), "JAX_NUM_PROCESSES='two' is not an integer"),
        (_jax_environ(index="2"), "0 <= JAX_PROCESS_ID < JAX_NUM_PROCESSES"),
        (_jax_environ(address="nohost"), "JAX_COORDINATOR_ADDRESS='nohost' is not host:port"),
    ],
)
def test_bad_jax_variables_are_one_line_errors_naming_them(environ, message):
    with pytest.raises(errors.DistributedError, match=message) as raised:
        distributed.job_from_environ(environ)
    assert "\n" not in str(raised.value)


def test_the_detection_error_names_every_cluster_jax_detects():
    from jax._src import clusters  # jax's registry of the environments it detects

    text = str(distributed._start_error(distributed.Job(), RuntimeError("no cluster")))
    words = {  # each cluster class -> how the message names it
        "OmpiCluster": "Open MPI",
        "SlurmCluster": "Slurm",
        "Mpi4pyCluster": "mpi4py",
        "BaseTpuCluster": "TPU",
        "GceTpuCluster": "Cloud TPU VMs (GCE)",
        "GkeTpuCluster": "TPUs on GKE",
        "K8sCluster": "Kubernetes",
    }
    for cluster in clusters.ClusterEnv._cluster_types:
        assert cluster.__name__ in words, f"jax detects {cluster.__name__}: name it in CLUSTERS"
        assert words[cluster.__name__] in text
    assert "JAX_COORDINATOR_ADDRESS" in text and "\n" not in text
