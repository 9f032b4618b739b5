"""What every benchmark line reports besides its figures: versions, device, allocator, memory."""

import pathlib
import resource
import sys

import flax
import jax

from tfjax.training import host


def describe() -> dict:
    """jax and flax versions, the default device's kind and platform, device count, malloc."""
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "device": device.device_kind,
        "platform": device.platform,
        "device_count": jax.device_count(),
        "host": host.malloc_description(),
    }


def peak_rss_bytes(status: str | pathlib.Path = "/proc/self/status") -> int:
    """Peak resident memory of this process's own address space so far.

    Linux: `VmHWM` of /proc/self/status. Not `ru_maxrss`: Linux carries a process's
    high-water mark over into the program it execs, and Python's subprocess starts a child
    with vfork + exec, so a child's ru_maxrss is at least its parent's peak (a child that
    allocates 13 MB reports the 1.9 GB of the process that started it). Elsewhere (no such
    file): ru_maxrss, which macOS gives in bytes and the BSDs in KiB.
    """
    try:
        text = pathlib.Path(status).read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("VmHWM:"):  # "VmHWM:   1234 kB": the kernel always writes kB
            return int(line.split()[1]) * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def device_peak_bytes() -> int | None:
    """Peak bytes the default device's allocator has held (GPU, TPU); None where not reported."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")
