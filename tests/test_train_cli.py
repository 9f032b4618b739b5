"""The command-line entry points in subprocesses: SIGKILL/SIGTERM, device counts, sweeps, two
runs on one workdir.

These start fresh Python processes (tens of seconds each), so they are marked slow.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfjax.runs import restoration, workdir_format
from tfjax.training import host, logger

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _train(workdir, *overrides, devices=1, spec="configs/base.py:tiny", flags=(), **kwargs):
    command = [
        sys.executable,
        "-m",
        "experiments.train",
        f"--config={spec}",
        f"--workdir={workdir}",
        *flags,
        *[f"--config.{o}" for o in overrides],
    ]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=_env(devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def _wait_for(path: pathlib.Path, predicate, timeout=300.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and predicate(path):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{path} never satisfied the condition")


def _params(workdir):
    config = workdir_format.load_config_json(workdir / "config.json")
    state = restoration.restore(config, workdir)[1].state
    return [np.asarray(x) for x in __import__("jax").tree.leaves(state.params)]


def _trained_steps(path):
    return [r["step"] for r in logger.read_metrics(path.parent, "train")]


SLOW_STEPS = [
    "train.num_train_steps=40",
    "train.checkpoint_every_steps=10",
    "train.log_every_steps=1",
    "train.eval_every_steps=0",
]


def test_sigkill_between_saves_then_rerun_is_bit_exact(tmp_path):
    straight = _train(tmp_path / "straight", *SLOW_STEPS)
    assert straight.wait() == 0, straight.stdout.read()
    killed = _train(tmp_path / "killed", *SLOW_STEPS)
    _wait_for(tmp_path / "killed" / "checkpoints" / "10", lambda p: p.is_dir())  # committed
    _wait_for(
        tmp_path / "killed" / "metrics.jsonl", lambda p: any(s > 14 for s in _trained_steps(p))
    )
    killed.send_signal(signal.SIGKILL)  # no chance to save: steps after 10 are lost
    killed.wait()
    rerun = _train(tmp_path / "killed", *SLOW_STEPS)
    output = rerun.communicate()[0]
    assert rerun.returncode == 0, output
    assert "resumed" in output, output
    for a, b in zip(_params(tmp_path / "straight"), _params(tmp_path / "killed"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_sigterm_saves_and_a_checkpoint_from_8_devices_resumes_on_1(tmp_path):
    proc = _train(tmp_path, *SLOW_STEPS, "train.checkpoint_every_steps=100", devices=8)
    _wait_for(tmp_path / "metrics.jsonl", lambda p: any(s >= 5 for s in _trained_steps(p)))
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate()[0]
    assert proc.returncode == 0, output
    assert "SIGTERM" in output
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and 5 <= saved[-1] < 40
    rerun = _train(tmp_path, *SLOW_STEPS, "train.checkpoint_every_steps=100", devices=1)
    output = rerun.communicate()[0]
    assert rerun.returncode == 0, output
    assert f"at step {saved[-1]}" in output
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == (
        "final_eval"
    )


def test_tuned_malloc_trains_bit_exactly_like_the_default(tmp_path):
    # JAX_PLATFORMS=cpu (_env): without a flag the CLI tunes glibc malloc where there is glibc.
    steps = ["train.num_train_steps=6", "train.eval_every_steps=0"]
    default = _train(tmp_path / "default", *steps, flags=["--notune_malloc"])
    tuned = _train(tmp_path / "tuned", *steps)
    outputs = []
    for proc in (default, tuned):
        outputs.append(proc.communicate()[0])
        assert proc.returncode == 0, outputs[-1]
    if host.glibc_version() is not None:
        assert "host malloc: glibc" in outputs[0] and ", default" in outputs[0]
        assert ", tuned" in outputs[1]
    for a, b in zip(_params(tmp_path / "default"), _params(tmp_path / "tuned"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_unknown_override_fails_with_close_matches(tmp_path):
    proc = _train(tmp_path, "optim.learnng_rate=3")
    output = proc.communicate()[0]
    assert proc.returncode == 2
    assert "did you mean 'optim.learning_rate'" in output
    assert not (tmp_path / "checkpoints").exists()


def test_two_runs_started_on_one_workdir_one_trains_the_other_exits_2(tmp_path):
    steps = ["train.num_train_steps=20", "train.log_every_steps=1", "train.eval_every_steps=0"]
    runs = [_train(tmp_path, *steps) for _ in range(2)]  # a double launch
    outputs = [run.communicate()[0] for run in runs]
    codes = [run.returncode for run in runs]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (runs[codes.index(0)], outputs[codes.index(2)])
    error = loser.strip().splitlines()[-1]
    assert error.startswith("error: workdir") and "in use by another training run" in error
    assert f"pid {winner.pid}" in error and "host " in error and "Traceback" not in loser
    trained = _trained_steps(tmp_path / "metrics.jsonl")
    assert trained == sorted(set(trained)) and trained[-1] == 20  # no step logged twice
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == (
        "final_eval"
    )


def test_sweep_runs_each_point_and_writes_a_summary(tmp_path):
    command = [
        sys.executable,
        "-m",
        "experiments.sweep",
        "--config=configs/base.py:tiny",
        "--sweep=lr",
        f"--workdir={tmp_path}",
        "--config.train.num_train_steps=2",
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=_env(1), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp_path / "lr" / "summary.md").read_text()
    assert summary.count("| ok") == 3 or summary.count("ok") >= 3, summary
    assert len(list((tmp_path / "lr").glob("*/checkpoints"))) == 3
