"""tfjax.training.host: glibc malloc tuning, checked on page faults of a real process.

Each case runs in a fresh interpreter: the tuning is process-wide and cannot be undone.
"""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from tfjax.training import host

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(host.glibc_version() is None, reason="needs glibc (Linux)")

_PAGES = 32768  # 128 MiB of 4 KiB pages: above glibc's largest mmap threshold (32 MiB)

# Allocates, touches and frees 128 MiB three times; prints the minor page faults of the last two.
_PROBE = textwrap.dedent(
    f"""
    import ctypes, resource, sys
    from tfjax.training import host
    tuned = host.tune_glibc_malloc() if sys.argv[1] == "tune" else False
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    size = {_PAGES} * 4096

    def cycle():
        pointer = libc.malloc(size)
        ctypes.memset(pointer, 1, size)
        libc.free(pointer)

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    cycle()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(tuned, (after - before) / 2, host.malloc_description())
    """
)


def _probe(mode: str) -> tuple[str, float, str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    tuned, faults, description = done.stdout.split(" ", 2)
    return tuned, float(faults), description.strip()


def test_default_glibc_faults_every_large_block_back_in():
    tuned, faults, description = _probe("default")
    assert tuned == "False"
    assert faults > 0.5 * _PAGES  # the control: without tuning the test below could fail
    assert description.endswith(", default")


def test_tuned_glibc_keeps_large_blocks_resident():
    tuned, faults, description = _probe("tune")
    assert tuned == "True"
    assert faults < 0.01 * _PAGES
    assert description == f"glibc {host.glibc_version()}, tuned"


def test_glibc_version_looks_like_a_version():
    major, minor = host.glibc_version().split(".")[:2]
    assert int(major) >= 2 and int(minor) >= 0


@pytest.mark.parametrize(
    "platforms, expected",
    [("cpu", True), ("CPU", True), ("cuda", False), ("cpu,tpu", False), ("tpu, cpu", False)],
)
def test_cpu_only_follows_jax_platforms(monkeypatch, platforms, expected):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert host.cpu_only() is expected
    assert host.should_tune_malloc(None) is expected


def test_cpu_only_without_jax_platforms_looks_for_accelerator_plugins(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.delenv("JAX_PLATFORM_NAME", raising=False)
    monkeypatch.setattr(host, "accelerator_plugins", lambda: [])
    assert host.cpu_only()
    monkeypatch.setattr(host, "accelerator_plugins", lambda: ["jax_cuda12_plugin"])
    assert not host.cpu_only()
    assert not host.should_tune_malloc(None)


def test_accelerator_plugins_finds_an_installed_plugin_module(monkeypatch, tmp_path):
    (tmp_path / "jax_cuda12_plugin").mkdir()
    (tmp_path / "jax_cuda12_plugin" / "__init__.py").write_text("")
    before = host.accelerator_plugins()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "jax_cuda12_plugin" not in before
    assert "jax_cuda12_plugin" in host.accelerator_plugins()


def test_an_explicit_choice_wins(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert host.should_tune_malloc(True) is True
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host.should_tune_malloc(False) is False


def test_cpu_unless_tpu_needs_libtpu_alone_and_no_tpu_device(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    environ = {}
    assert host.cpu_unless_tpu(environ, ["libtpu"], str(dev))
    assert environ == {"JAX_PLATFORMS": "cpu"}
    for chosen in ({"JAX_PLATFORMS": "tpu"}, {"JAX_PLATFORM_NAME": "cpu"}):
        assert not host.cpu_unless_tpu(dict(chosen), ["libtpu"], str(dev))  # the user's
    for plugins in ([], ["jax_cuda12_plugin", "libtpu"]):
        environ = {}
        assert not host.cpu_unless_tpu(environ, plugins, str(dev)) and environ == {}
    (dev / "vfio").mkdir()
    (dev / "vfio" / "vfio").touch()  # the control file alone: no chip
    assert host.cpu_unless_tpu({}, ["libtpu"], str(dev))
    (dev / "vfio" / "0").touch()  # a TPU v5p / v6e chip
    assert not host.cpu_unless_tpu({}, ["libtpu"], str(dev))
    (dev / "vfio" / "0").unlink()
    (dev / "accel0").touch()  # a TPU v4 / v5e chip
    assert not host.cpu_unless_tpu({}, ["libtpu"], str(dev))


@pytest.mark.slow
def test_a_sweep_run_without_jax_platforms_is_tuned_and_quiet(tmp_path):
    """A sweep's child run where libtpu is installed on a host without TPUs (this one, when
    it is): the allocator is tuned as in `experiments.train` and libtpu prints nothing."""
    if host.accelerator_plugins() != ["libtpu"] or host.tpu_devices_present():
        pytest.skip("needs libtpu installed, no other accelerator plugin and no TPU chip")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    tiny = ["data.name=reverse", "data.num_train_examples=64", "data.num_eval_examples=10"]
    tiny += ["data.task_max_len=6", "data.max_source_len=8", "data.max_target_len=8"]
    config = tmp_path / "one_point.py"  # the tiny preset, a sweep of one run
    config.write_text(
        "from configs import base\n"
        "def get_config(arg=None):\n    return base.get_config(arg)\n"
        "def get_sweep(arg=None):\n    return [{'optim.learning_rate': 0.001}]\n"
    )
    command = [sys.executable, "-m", "experiments.sweep", f"--config={config}:tiny"]
    command += ["--sweep=one", f"--workdir={tmp_path}", "--config.train.num_train_steps=1"]
    command += [f"--config.{o}" for o in tiny]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "host malloc: glibc" in output and ", tuned" in output, output[-3000:]
    for word in ("TPU", "libtpu", "InitGoogle", "E0000"):
        assert word not in output, output[-3000:]


def test_process_seconds_is_the_age_of_the_process():
    # A child that sleeps 1 s after its imports reports an age between 1 s and the time the
    # parent waited for it (one clock tick, 10 ms, of slack for /proc's resolution).
    script = (
        "import time; from tfjax.training import host; time.sleep(1.0); "
        "print(host.process_seconds())"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    waited = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    age = float(done.stdout)
    assert 1.0 <= age <= waited + 0.02, (age, waited)
