"""Test set-up: 8 simulated CPU devices and runtime shape checks.

XLA_FLAGS must be set before jax is imported anywhere, which is why it lives here.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib

import pytest

# Runtime checks of every jaxtyping annotation in tfjax: shape letters must agree across the
# arguments of a call (e.g. the same B in `q` and `mask`). Installed before tfjax is imported.
from jaxtyping import install_import_hook

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
