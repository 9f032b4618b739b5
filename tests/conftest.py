"""Test set-up: 8 simulated CPU devices and runtime shape checks.

XLA_FLAGS must be set before jax is imported anywhere, which is why it lives here.
"""

import os

# The tests' programs are tiny and most run a few times, so compiling them is most of their cost:
# LLVM at its lowest optimisation level cuts the suite's CPU time by about a fifth (XLA's own
# graph passes still run, so fusions and layouts are the ones users get). Entry points the tests
# start inherit it. TFJAX_TEST_XLA_OPTIMIZE=1 compiles as users do.
_OPT = (
    ""
    if os.environ.get("TFJAX_TEST_XLA_OPTIMIZE") == "1"
    else " --xla_backend_optimization_level=0"
)
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

install_import_hook("tfjax", "beartype.beartype")


def _data_dir() -> pathlib.Path | None:
    env = os.environ.get("TFJAX_DATA_DIR")
    if env:
        return pathlib.Path(env)
    default = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return default if default.exists() else None


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The shared corpora folder; tests that need it skip with the reason when it is absent."""
    path = _data_dir()
    if path is None or not path.exists():
        pytest.skip("shared corpora not found: set TFJAX_DATA_DIR to the folder with SHA256SUMS")
    return path
