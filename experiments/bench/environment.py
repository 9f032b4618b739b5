"""What every benchmark line reports besides its figures: versions, device, allocator, memory."""

import resource

import flax
import jax

from tfjax.training import runtime


def describe() -> dict:
    """jax and flax versions, the default device's kind and platform, device count, malloc."""
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "device": device.device_kind,
        "platform": device.platform,
        "device_count": jax.device_count(),
        "host_malloc": runtime.malloc_description(),
    }


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_peak_bytes() -> int | None:
    """Peak bytes the default device's allocator has held (GPU, TPU); None where not reported."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")
