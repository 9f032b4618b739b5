"""Multi-process training with real processes on one machine (`experiments.launch_local`).

Two processes with 4 simulated CPU devices each (collectives over gloo on 127.0.0.1) train the
tiny encoder-decoder with the real command line, and are compared with independent references
trained as ordinary single processes on 1 device and on 8 devices: parameters to 1e-5, logged
metrics, the rows each process reads, checkpoints across topologies, a process that dies.

Dropout and biases are off for the same reasons as in tests/test_parallel.py; `model.mlp_dim`
512 makes the [32, 512] feed-forward kernels reach `strategies.FSDP_MIN_SIZE`, so FSDP really
splits them (and their Adam moments) in the sharded runs. Every run is a subprocess with a
timeout, and the launcher's processes die with it. The runs are shared by the tests that
compare them: computed once per session, also across pytest-xdist workers (a lock file per
run), with compiled programs cached on disk for the session.
"""

import fcntl
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import portpicker
import pytest

from experiments import config_utils
from tfjax.data import datasets, pipeline
from tfjax.models import kinds
from tfjax.parallel import distributed
from tfjax.runs import restoration, workdir_format
from tfjax.training import logger

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SPEC = "configs/base.py:tiny"
STEPS, HALF = 8, 4
ATOL = 1e-5  # as tests/test_parallel.py: 8 Adam steps in another reduction order agree to ~2e-6
TIMEOUT = 300  # seconds for one job; the launcher kills it after that
HEARTBEAT = 10  # parallel.heartbeat_timeout_seconds: a dead process is noticed within this
COMMON = [
    "data.name=reverse",
    "data.num_train_examples=512",
    "data.num_eval_examples=24",
    "data.pack=false",
    "model.dropout_rate=0.0",
    "model.use_bias=false",
    "model.mlp_dim=512",
    "train.eval_every_steps=0",
    "train.checkpoint_every_steps=4",
    "train.log_every_steps=2",
    "train.keep_checkpoints=8",
    f"parallel.heartbeat_timeout_seconds={HEARTBEAT}",
]
FSDP = ["parallel.mode=sharded", "parallel.fsdp=2"]


def _env(root: pathlib.Path, devices: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFJAX_")}
    env = {k: v for k, v in env.items() if k not in distributed.JAX_ENV_VARS}
    env.update(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(root / "jax_cache"))
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _train(workdir: pathlib.Path, steps: int, *overrides: str) -> list[str]:
    config = [*COMMON, f"train.num_train_steps={steps}", *overrides]
    return [
        sys.executable,
        "-m",
        "experiments.train",
        f"--config={SPEC}",
        f"--workdir={workdir}",
        *[f"--config.{o}" for o in config],
    ]


def _launch(command: list[str], *, processes: int = 2, devices: int = 4, flags=()) -> list:
    return [
        sys.executable,
        "-m",
        "experiments.launch_local",
        f"--processes={processes}",
        f"--devices_per_process={devices}",
        f"--timeout_seconds={TIMEOUT}",
        *flags,
        "--",
        *command,
    ]


def _run(command: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT + 60
    )


def _succeeded(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


@pytest.fixture(scope="session")
def root(tmp_path_factory) -> pathlib.Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers of one session share it
    path = base / "multihost"
    path.mkdir(exist_ok=True)
    return path


def _once(root: pathlib.Path, name: str, make) -> tuple[pathlib.Path, str]:
    """(workdir, output) of `make(workdir) -> output`, run once per session by the first."""
    workdir, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(workdir, ignore_errors=True)
            done.write_text(make(workdir))
    return workdir, done.read_text()


def _single(root, name, steps, devices, *overrides, start_from=None):
    def make(workdir):
        if start_from is not None:
            shutil.copytree(start_from, workdir)
        return _succeeded(_run(_train(workdir, steps, *overrides), _env(root, devices)))

    return _once(root, name, make)


def _two(root, name, steps, *overrides, start_from=None):
    def make(workdir):
        if start_from is not None:
            shutil.copytree(start_from, workdir)
        return _succeeded(_run(_launch(_train(workdir, steps, *overrides)), _env(root)))

    return _once(root, name, make)


@pytest.fixture(scope="session")
def one_device(root):
    return _single(root, "one_device", HALF, 1)


@pytest.fixture(scope="session")
def eight_devices(root):
    return _single(root, "eight_devices", STEPS, 8)


@pytest.fixture(scope="session")
def two_pmap(root):
    return _two(root, "two_pmap", HALF)


@pytest.fixture(scope="session")
def two_fsdp(root):
    return _two(root, "two_fsdp", STEPS, *FSDP)


_PARAMS: dict = {}


def _params(workdir: pathlib.Path, step: int):
    """The parameters of checkpoint `step` as numpy arrays (restored in this process)."""
    if (workdir, step) not in _PARAMS:
        config = workdir_format.load_config_json(workdir / "config.json")
        restored = restoration.restore(config, workdir, step)[1]
        _PARAMS[workdir, step] = jax.device_get(restored.state.params)
    return _PARAMS[workdir, step]


def _assert_close(actual, expected):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=ATOL), actual, expected)


def test_two_processes_with_pmap_end_with_the_parameters_of_one_process(
    one_device, eight_devices, two_pmap
):
    reference = _params(one_device[0], HALF)
    _assert_close(_params(two_pmap[0], HALF), reference)
    _assert_close(_params(eight_devices[0], HALF), reference)
    moved = jax.tree.map(
        lambda a, b: float(np.abs(a - b).max()), _params(eight_devices[0], STEPS), reference
    )
    assert max(jax.tree.leaves(moved)) > 1e-3  # steps 5-8 still change the parameters


def _fsdp_specs(checkpoint: pathlib.Path) -> list[str]:
    """The partition specs orbax recorded for the state's arrays (its `_sharding` file)."""
    records = json.loads((checkpoint / "state" / "_sharding").read_text())
    return [json.dumps(json.loads(value).get("partition_spec")) for value in records.values()]


def _written_by(checkpoint: pathlib.Path, process: int) -> int:
    folder = checkpoint / "state" / f"ocdbt.process_{process}"
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def test_two_processes_with_fsdp_shard_the_parameters_and_end_like_one_process(
    eight_devices, two_fsdp
):
    _assert_close(_params(two_fsdp[0], STEPS), _params(eight_devices[0], STEPS))
    checkpoint = two_fsdp[0] / "checkpoints" / str(STEPS)
    # The 2 feed-forward kernels of each stack, with their 2 Adam moments, split over "fsdp".
    assert sum('"fsdp"' in spec for spec in _fsdp_specs(checkpoint)) >= 12
    assert _written_by(checkpoint, 0) > 0 and _written_by(checkpoint, 1) > 0


def test_process_0_alone_writes_logs_and_they_hold_the_global_metrics(one_device, two_pmap):
    train = logger.read_metrics(two_pmap[0], "train")
    assert [r["step"] for r in train] == [2, 4]  # once each: process 1 wrote no metrics
    for ours, reference in zip(train, logger.read_metrics(one_device[0], "train"), strict=True):
        for key in ("loss", "nll", "accuracy", "exact_match", "grad_norm", "learning_rate"):
            np.testing.assert_allclose(ours[key], reference[key], rtol=1e-5, err_msg=key)
    final, reference = (logger.read_metrics(w, "final_eval") for w in (two_pmap[0], one_device[0]))
    assert len(final) == 1 and final[0].keys() == reference[0].keys()
    for key, value in reference[0].items():  # greedy BLEU too: predictions of both processes
        if isinstance(value, float):
            np.testing.assert_allclose(final[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert len(list((two_pmap[0] / logger.TENSORBOARD_DIR).rglob("*tfevents*"))) == 1
    assert (two_pmap[0] / "config.json").is_file() and (two_pmap[0] / "tokenizer.json").is_file()
    checkpoint = two_pmap[0] / "checkpoints" / str(HALF)
    assert _written_by(checkpoint, 0) > 0 and _written_by(checkpoint, 1) > 0


# Run by each of the 2 processes: the rows of 3 training batches that this process reads, and
# the global batch the strategy assembles from every process's rows, for pmap and FSDP.
WORKER = """
import pathlib, sys
import numpy as np
from experiments import config_utils
from tfjax.parallel import distributed

distributed.initialize(distributed.job_from_environ())
import jax
from jax.experimental import multihost_utils
from tfjax.runs import build

out = pathlib.Path(sys.argv[1])
for mode, fsdp in (("pmap", 1), ("sharded", 2)):
    overrides = [*sys.argv[3:], f"parallel.mode={mode}", f"parallel.fsdp={fsdp}"]
    config = config_utils.load_config(sys.argv[2], overrides)
    run = build.build(config, out / "workdir")
    rows = run.strategy.host_rows(config.train.global_batch_size)
    iterator = build.train_iterator(run)
    local, assembled = [], []
    for _ in range(3):
        batch = next(iterator)
        local.append(batch["targets"])
        placed = run.strategy.put_batch(batch)["targets"]
        whole = np.asarray(multihost_utils.process_allgather(placed, tiled=True))
        assembled.append(whole.reshape(-1, whole.shape[-1]))
    np.savez(
        out / f"{mode}_{jax.process_index()}.npz",
        local=np.stack(local),
        assembled=np.stack(assembled),
        rows=np.array([rows.start, rows.stop]),
    )
"""


def test_each_process_reads_its_own_rows_of_every_global_batch(root, tmp_path):
    command = [sys.executable, "-c", WORKER, str(tmp_path), SPEC, *COMMON]
    _succeeded(_run(_launch(command), _env(root)))
    config = config_utils.load_config(SPEC, COMMON)
    examples = datasets.load(
        datasets.DataConfig(**config.data), kinds.get("encoder_decoder"), seed=0
    )
    size, half = config.train.global_batch_size, config.train.global_batch_size // 2
    dataset = pipeline.make_dataset(examples.train, batch_size=size, seed=config.seed)
    expected = np.stack([dataset[i]["targets"] for i in range(3)])  # one process's batches
    for mode in ("pmap", "sharded"):
        parts = [np.load(tmp_path / f"{mode}_{i}.npz") for i in range(2)]
        assert [p["rows"].tolist() for p in parts] == [[0, half], [half, size]]
        for i, part in enumerate(parts):  # disjoint halves that together are the batch
            np.testing.assert_array_equal(part["local"], expected[:, i * half : (i + 1) * half])
            np.testing.assert_array_equal(part["assembled"], expected)
        assert not np.array_equal(parts[0]["local"], parts[1]["local"])


def test_checkpoint_of_two_processes_resumes_on_one_and_on_eight_devices(
    root, two_pmap, eight_devices
):
    for devices in (1, 8):
        workdir, output = _single(
            root, f"two_then_{devices}", STEPS, devices, start_from=two_pmap[0]
        )
        assert f"at step {HALF}" in output and "resumed from" in output, output[-3000:]
        _assert_close(_params(workdir, STEPS), _params(eight_devices[0], STEPS))


def _child(launcher: int, index: int, timeout: float = 120) -> int:
    """The pid of process `index` started by the launcher `launcher`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                environ = (stat.parent / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if parent == launcher and f"TFJAX_PROCESS_ID={index}".encode() in environ:
                return int(stat.parent.name)
        time.sleep(0.1)
    raise TimeoutError(f"the launcher {launcher} started no process {index}")


def _wait_for_step(workdir: pathlib.Path, step: int, job: subprocess.Popen, output) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not any(r["step"] >= step for r in logger.read_metrics(workdir, "train")):
        assert job.poll() is None, output.read_text()[-6000:]
        assert time.monotonic() < deadline, "the job never reached step {step}"
        time.sleep(0.02)


def _complete_checkpoints(workdir: pathlib.Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if (p / "commit_success.txt").exists())


def test_a_dead_process_ends_the_job_and_the_rerun_resumes(
    root, tmp_path, one_device, eight_devices
):
    """Resumes a 1-process checkpoint on 2 processes, kills process 1, reruns the command."""
    workdir = tmp_path / "run"
    shutil.copytree(one_device[0], workdir)  # a checkpoint of 1 process x 1 device, step 4
    # Each step logs, evaluates 16 examples and saves, so the kill lands long before step 8.
    slow = ["train.log_every_steps=1", "train.eval_every_steps=1", "train.max_eval_examples=16"]
    train = _train(workdir, STEPS, *slow, "train.checkpoint_every_steps=1")
    command = _launch(train, flags=["--grace_seconds=120"])  # time for JAX to end process 0
    output = tmp_path / "output.txt"
    with open(output, "w") as sink:
        job = subprocess.Popen(command, cwd=ROOT, env=_env(root), stdout=sink, stderr=sink)
        try:
            _wait_for_step(workdir, HALF + 1, job, output)
            os.kill(_child(job.pid, 1), signal.SIGKILL)
            killed = time.monotonic()
            status = job.wait(timeout=TIMEOUT)
        finally:
            job.kill()
    ended_after, text = time.monotonic() - killed, output.read_text()
    assert status == 128 + signal.SIGKILL, text[-6000:]
    assert "error: process 1 of 2 was killed by SIGKILL first." in text
    assert "killed process(es)" not in text  # process 0 ended by itself ...
    assert ended_after < HEARTBEAT + 50  # ... within the heartbeat timeout, plus slack
    assert "another task died" in text or "a collective failed" in text  # and said why
    assert not logger.read_metrics(workdir, "final_eval")[1:]  # only the copied step-4 one
    resume = _complete_checkpoints(workdir)[-1]
    assert HALF <= resume < STEPS
    rerun = _succeeded(_run(command, _env(root)))
    assert f"resumed from {workdir / 'checkpoints'} at step {resume}" in rerun, rerun[-3000:]
    _assert_close(_params(workdir, STEPS), _params(eight_devices[0], STEPS))


# Loaded by every process of the job (PYTHONPATH): process 1 kills itself as it starts saving
# step 3, so process 0 meets its death in orbax's barrier at the start of that save.
_DIE_IN_SAVE = """
import os
if os.environ.get("TFJAX_PROCESS_ID") == "1":
    import signal
    import orbax.checkpoint as ocp
    _save = ocp.CheckpointManager.save
    def _dying(self, step, *args, **kwargs):
        if step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return _save(self, step, *args, **kwargs)
    ocp.CheckpointManager.save = _dying
"""


def test_a_process_killed_while_the_other_saves_ends_the_survivor_in_one_line(root, tmp_path):
    """Process 1 dies as a checkpoint save starts: process 0 meets it in orbax's barrier (a
    gloo ValueError, not a JaxRuntimeError), prints the one-line DistributedError and exits by
    itself, within the launcher's grace period."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_DIE_IN_SAVE)
    env = _env(root)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(inject), env.get("PYTHONPATH")]))
    train = _train(tmp_path / "run", STEPS, "train.checkpoint_every_steps=1")
    result = _run(_launch(train, flags=[f"--grace_seconds={HEARTBEAT + 30}"]), env)
    text = result.stdout + result.stderr
    assert result.returncode == 128 + signal.SIGKILL, text[-6000:]
    assert "error: process 1 of 2 was killed by SIGKILL first." in text
    assert "killed process(es)" not in text, text[-6000:]  # process 0 ended by itself
    survivor = [line for line in text.splitlines() if "error: process 0 of 2 stopped" in line]
    assert len(survivor) == 1, text[-6000:]
    assert "at step 3: a collective failed" in survivor[0], survivor[0]
    assert "most recent call" not in text, text[-6000:]  # no traceback, no crash in shutdown


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error: " in line]


def test_bad_launches_are_one_line_errors(root, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        launcher = _run(_launch(["true"], flags=[f"--port={port}"]), _env(root))
        assert launcher.returncode == 2 and _errors(launcher.stderr) == [
            f"error: port {port} on 127.0.0.1 is in use (Address already in use): pick "
            "another --port, or leave it out and a free one is chosen"
        ]
        env = _env(root, 1)
        env.update(TFJAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", TFJAX_NUM_PROCESSES="2")
        coordinator = _run(_train(tmp_path / "a", 2), {**env, "TFJAX_PROCESS_ID": "0"})
    assert coordinator.returncode == 2, coordinator.stderr[-3000:]
    assert _errors(coordinator.stderr) == [
        f"error: process 0 cannot serve the coordinator on port {port} (Address already in "
        "use): is another process 0 running (each process needs its own TFJAX_PROCESS_ID), or "
        "another program on the port? choose a free one in TFJAX_COORDINATOR_ADDRESS, or let "
        "python -m experiments.launch_local pick one"
    ]
    late = ["parallel.initialization_timeout_seconds=2"]  # nothing listens on `port` now
    joiner = _run(_train(tmp_path / "b", 2, *late), {**env, "TFJAX_PROCESS_ID": "1"})
    assert joiner.returncode == 2 and len(_errors(joiner.stderr)) == 1, joiner.stderr[-3000:]
    assert f"the coordinator at 127.0.0.1:{port} (process 0) did not answer" in joiner.stderr
    alone = _run(_train(tmp_path / "c", 2, "parallel.distributed=true"), _env(root, 1))
    assert alone.returncode == 2 and len(_errors(alone.stderr)) == 1
    assert "no cluster JAX knows was detected (Cloud TPU VMs (GCE), " in alone.stderr
    assert all(cluster in alone.stderr for cluster in ("Slurm", "Open MPI", "Kubernetes"))
    assert not any((tmp_path / name).exists() for name in "abc")  # nothing was written


WAIT = 5  # parallel.initialization_timeout_seconds in the jobs that cannot form


def _http_listener() -> socket.socket:
    """Another program on a port: it answers every connection like a web server."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn = server.accept()[0]
            except OSError:  # closed
                return
            with conn:
                conn.recv(1000)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_job_that_cannot_form_ends_in_one_line_on_every_process(root, tmp_path):
    """Each case as `experiments.train` processes started by hand: one `error:` line each,
    status 2, within the stated wait (not JAX's native abort after 300 s), nothing written."""
    free = [portpicker.pick_unused_port() for _ in range(3)]
    with _http_listener() as web:
        cases = {  # name -> (coordinator address, process count, process id) of each process
            "alone": [(f"127.0.0.1:{free[0]}", 2, 0)],
            "counts": [(f"127.0.0.1:{free[1]}", 2, 0), (f"127.0.0.1:{free[1]}", 3, 1)],
            "two_0": [(f"127.0.0.1:{free[2]}", 2, 0), (f"127.0.0.1:{free[2]}", 2, 0)],
            "no_host": [("no-such-host.invalid:12355", 2, 1)],
            "web": [(f"127.0.0.1:{web.getsockname()[1]}", 2, 1)],
        }
        started, running, ends = time.monotonic(), {}, {}
        for name, processes in cases.items():
            for i, (address, count, index) in enumerate(processes):
                env = {**_env(root, 1), "TFJAX_COORDINATOR_ADDRESS": address}
                env.update(TFJAX_NUM_PROCESSES=str(count), TFJAX_PROCESS_ID=str(index))
                late = f"parallel.initialization_timeout_seconds={WAIT}"
                command = _train(tmp_path / f"{name}{i}", 2, late)
                running[name, i] = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                time.sleep(0.5 * (name == "two_0"))  # the first one serves the port
        for key, process in running.items():
            stderr = process.communicate(timeout=TIMEOUT)[1]
            ends[key] = (process.returncode, stderr)
    assert time.monotonic() - started < WAIT + 120  # not JAX's 300 s
    for (name, i), (status, stderr) in ends.items():
        assert status == 2 and len(_errors(stderr)) == 1, f"{name} {i}: {stderr[-3000:]}"
        assert "Check failure" not in stderr and "Traceback" not in stderr
    line = {key: _errors(stderr)[0] for key, (_, stderr) in ends.items()}
    assert line["alone", 0].startswith(
        f"error: process 1 of 2 did not join process 0 at 127.0.0.1:{free[0]} within"
    )
    assert f"within {WAIT} s (parallel.initialization_timeout_seconds)" in line["alone", 0]
    assert (
        "was started with TFJAX_NUM_PROCESSES=3, process 0 with TFJAX_NUM_PROCESSES=2"
        in (line["counts", 0])
    )
    assert line["counts", 1] == "error: the job did not start; process 0 says: " + (
        line["counts", 0].removeprefix("error: ")
    )
    two = sorted(line["two_0", i] for i in (0, 1))
    assert two[0].startswith(f"error: process 0 cannot serve the coordinator on port {free[2]}")
    assert two[1].startswith(f"error: process 1 of 2 did not join process 0 at 127.0.0.1:{free[2]}")
    assert "'no-such-host.invalid' does not resolve" in line["no_host", 0]
    assert "something else listens at 127.0.0.1:" in line["web", 0]
    assert not any(tmp_path.iterdir())  # no workdir was made


def test_killing_process_0_ends_process_1_in_one_line(root, tmp_path):
    """Process 0 (which serves JAX's coordination service) is killed mid-run: JAX's client
    aborts process 1 natively; the launcher shows one line for it, not the stack traces."""
    workdir = tmp_path / "run"
    slow = ["train.log_every_steps=1", "train.eval_every_steps=1", "train.max_eval_examples=16"]
    command = _launch(_train(workdir, STEPS, *slow), flags=["--grace_seconds=60"])
    output = tmp_path / "output.txt"
    with open(output, "w") as sink:
        job = subprocess.Popen(command, cwd=ROOT, env=_env(root), stdout=sink, stderr=sink)
        try:
            _wait_for_step(workdir, 2, job, output)
            os.kill(_child(job.pid, 0), signal.SIGKILL)
            status = job.wait(timeout=TIMEOUT)
        finally:
            job.kill()
    text = output.read_text()
    assert status == 128 + signal.SIGKILL, text[-6000:]
    assert _errors(text)[-1].startswith("error: process 0 of 2 was killed by SIGKILL first.")
    assert "killed process(es)" not in text  # process 1 ended by itself ...
    survivor = [line for line in _errors(text) if line.startswith("[1] ")]
    assert len(survivor) == 1, text[-6000:]  # ... in one line (a failed collective or the abort)
    for native in ("Check failure stack trace", "Fatal Python error", "client.h:"):
        assert native not in text, text[-6000:]


def test_a_job_started_with_jax_own_variables_runs_as_two_processes(root, tmp_path):
    env = _env(root, 1)
    env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{portpicker.pick_unused_port()}")
    env.update(JAX_NUM_PROCESSES="2")
    command = _train(tmp_path / "run", 2)
    started = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "JAX_PROCESS_ID": str(index)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    outputs = [process.communicate(timeout=TIMEOUT)[0] for process in started]
    assert [process.returncode for process in started] == [0, 0], outputs[0][-3000:]
    assert "devices: 2 x cpu" in outputs[0]  # one device each, one job of two
    assert "devices:" not in outputs[1]  # process 1 prints nothing of its own
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_batch_that_does_not_divide_over_the_processes_is_refused(root, tmp_path):
    command = _launch(_train(tmp_path / "run", 2), processes=3, devices=1)
    result = _run(command, _env(root))
    assert result.returncode == 2, result.stderr[-3000:]
    message = (
        "error: train.global_batch_size=8 must be divisible by the number of devices "
        "(3 hosts x 1 local devices = 3)"
    )
    lines = _errors(result.stderr)
    assert sorted(lines[:-1]) == [f"[{i}] {message}" for i in range(3)], result.stderr[-3000:]
    assert re.fullmatch(
        r"error: process [012] of 3 exited with status 2 first\. Its output is on the lines "
        r"\[[012]\] above; fix what its error line says, then rerun",
        lines[-1],
    )
    assert not (tmp_path / "run").exists()
