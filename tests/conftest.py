"""Test set-up: 8 simulated CPU devices and runtime shape checks.

XLA_FLAGS must be set before jax is imported anywhere, which is why it lives here.
"""

import gc
import os
import subprocess
import sys

# The tests' programs are tiny and most run a few times, so compiling them is most of their cost
# (run op by op, every new (operation, shape) pair is a program of its own). Two XLA:CPU options
# halve that without touching XLA's graph passes, so the fusions and layouts are the ones users
# get: LLVM at its lowest optimisation level, and the direct LLVM emitters for fused loops
# instead of the MLIR fusion emitters (figures: docs/tests.md). Entry points the tests start in
# process inherit them. TFJAX_TEST_XLA_OPTIMIZE=1 compiles as users do.
_FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _fast_compile_flags() -> str:
    """The flags of _FAST_COMPILE that this jaxlib knows: XLA ends the process on a flag it does
    not know, so a child process tries the second one first (once per session: the xdist
    workers inherit the answer)."""
    known = os.environ.get("TFJAX_TEST_FAST_COMPILE_FLAGS")
    if known is None:
        probe = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices()"],
            env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=_FAST_COMPILE[1]),
            capture_output=True,
            check=False,
        )
        known = " ".join(_FAST_COMPILE if probe.returncode == 0 else _FAST_COMPILE[:1])
        os.environ["TFJAX_TEST_FAST_COMPILE_FLAGS"] = known
    return known


_OPT = "" if os.environ.get("TFJAX_TEST_XLA_OPTIMIZE") == "1" else " " + _fast_compile_flags()
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8" + _OPT
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# JAX's persistent compilation cache, shared by the xdist workers and the entry points the tests
# start as subprocesses: a program compiled once (the same tiny model in many tests) is read back
# instead of compiled again, and a second run of the suite compiles little. Every program is
# kept (the default threshold skips those under a second, most of the suite's). It lives in
# pytest's cache folder, so `pytest --cache-clear` or deleting `.pytest_cache` empties it;
# TFJAX_TEST_COMPILATION_CACHE=DIR moves it and TFJAX_TEST_COMPILATION_CACHE=off turns it off.
_CACHE = os.environ.get("TFJAX_TEST_COMPILATION_CACHE") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"
)
if _CACHE != "off":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pathlib  # noqa: E402 (the environment above must be set before anything imports jax)

import pytest  # noqa: E402

# Runtime checks of every jaxtyping annotation in tfjax: shape letters must agree across the
# arguments of a call (e.g. the same B in `q` and `mask`). Installed before tfjax is imported.
from jaxtyping import install_import_hook  # noqa: E402

# Left out: the data modules that run plain Python once per example and hold no array
# annotations. The hook wraps every call: packing SCAN's 16,728 training examples took 2.4-3.8 s
# under it instead of 0.3 s, and reading a tiny SCAN run's data 3.7-4.7 s instead of 0.7 s
# (1.3-1.4 s with these modules left out).
_UNCHECKED = {"tfjax.data.packing", "tfjax.data.pipeline", "tfjax.data.scan", "tfjax.data.listops"}


def _checked_modules() -> list[str]:
    """tfjax's modules but _UNCHECKED: subpackages whole, tfjax.data module by module (the hook
    takes a name to cover the modules under it too)."""
    root = pathlib.Path(__file__).resolve().parents[1] / "tfjax"
    names = [f"tfjax.{p.stem}" for p in root.iterdir() if p.suffix == ".py" or p.is_dir()]
    names = [n for n in names if n not in ("tfjax.__init__", "tfjax.data", "tfjax.__pycache__")]
    data = [f"tfjax.data.{p.stem}" for p in (root / "data").glob("*.py") if p.stem != "__init__"]
    return sorted(names + [n for n in data if n not in _UNCHECKED])


install_import_hook(_checked_modules(), "beartype.beartype")


def _freeze_survivors(phase: str, info: dict) -> None:
    """After each full garbage collection, moves what survived out of later ones (`gc.freeze`).

    A suite worker's heap grows to hold every module, jaxpr and executable of the tests it ran,
    and a full collection scanned all of it (up to ~1.3 s; test_checkpointing collects after
    each of its tests). In one default-tier run the collector took 21-27 s of each worker's
    time, 17-22 s of it in full collections; with this, 5.5-6.6 s and 1.9-2.3 s. The price:
    reference cycles among frozen objects are never freed, which a test process does not feel.
    """
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


gc.callbacks.append(_freeze_survivors)


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The data directory a user's run reads (`tfjax.data.sources.data_dir`: $TFJAX_DATA_DIR,
    else ~/.cache/tfjax/data), when it holds every named corpus; a test that needs the corpora
    skips otherwise, the reason naming the commands that fetch them. A corrupt corpus is not
    skipped: its test fails on the checksum."""
    from tfjax.data import corpora, sources

    root = sources.data_dir()
    absent = [
        corpus.name
        for corpus in corpora.CORPORA.values()
        if not all((root / name).is_file() for name in corpus.names())
    ]
    if absent:
        fetch = "; ".join(corpora.fetch_command(name) for name in absent)
        pytest.skip(f"corpora {', '.join(absent)} not in the data directory {root}: {fetch}")
    return root


@pytest.fixture
def fake_corpus(monkeypatch):
    """`fake_corpus(root, {"tinyshakespeare/input.txt": text})`: a few lines standing in for a
    named corpus in `root`, verified against their own sums for this test
    (`tiny_runs.write_corpus`); returns `root`, to be given as `data.dir`."""
    from tiny_runs import write_corpus

    return lambda root, files: write_corpus(monkeypatch, pathlib.Path(root), files)
