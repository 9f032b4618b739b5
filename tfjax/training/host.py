"""Process-level settings of the host: glibc allocator tuning for CPU steps, the CPU as JAX's
platform where libtpu is installed without TPUs (`cpu_unless_tpu`), and the process's age
(`process_seconds`, for the trainer's time to the first step).

XLA:CPU asks for one temporary buffer per execution of a compiled program (about 640 MB for the
benchmark train step, `experiments.bench`), frees it when the step ends, and does so from its
worker threads. glibc serves an allocation that large from a fresh `mmap` and returns it with
`munmap` on free, so every step touches ~160,000 new pages (the cost, measured:
docs/performance.md).

`tune_glibc_malloc()` keeps that memory in the process instead (glibc's `mallopt`): one arena for
all threads (worker-thread arenas always `mmap` large blocks), no `mmap` for large blocks, no
trimming of the heap, and a generous top pad. It changes the whole process: freed memory stays
resident (peak RSS, not current use, becomes the footprint) and every thread shares one arena.
So the library never calls it on import; the command-line tools (`experiments.train`,
`experiments.bench`) call it by default where JAX will compute on the CPU alone
(`should_tune_malloc`), with `--tune_malloc` / `--notune_malloc` to decide explicitly.

It must run before the first JAX computation: threads that already allocated keep their own
arenas and the tuning no longer reaches them. The same settings as environment variables, for a
process you launch yourself: `MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=2147483647 MALLOC_TOP_PAD_=1073741824`.
"""

import ctypes
import ctypes.util
import functools
import importlib.metadata
import importlib.util
import os
import pathlib

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

TUNED_SETTINGS = {
    "arena_max": 1,
    "mmap_max": 0,
    "trim_threshold": 2**31 - 1,
    "top_pad": 2**30,
}
_PARAMS = {
    "arena_max": _M_ARENA_MAX,
    "mmap_max": _M_MMAP_MAX,
    "trim_threshold": _M_TRIM_THRESHOLD,
    "top_pad": _M_TOP_PAD,
}
_state = {"tuned": False}
# Modules whose presence means JAX may pick an accelerator (TPU runtime, GPU plugins).
_ACCELERATOR_MODULES = (
    "libtpu",
    "jax_cuda12_plugin",
    "jax_cuda13_plugin",
    "jax_rocm60_plugin",
    "jax_rocm7_plugin",
)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (has `gnu_get_libc_version`), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def glibc_version() -> str | None:
    """glibc's version string, or None when the C library is not glibc (macOS, musl)."""
    libc = _glibc()
    if libc is None:
        return None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    return libc.gnu_get_libc_version().decode()


def tune_glibc_malloc() -> bool:
    """Apply `TUNED_SETTINGS` to glibc malloc; True if applied, False where there is no glibc.

    Call it before the first JAX computation (see the module docstring). Raises RuntimeError if
    glibc rejects a setting.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for name, value in TUNED_SETTINGS.items():
        if libc.mallopt(_PARAMS[name], value) != 1:
            raise RuntimeError(f"glibc mallopt rejected {name}={value} (glibc {glibc_version()})")
    _state["tuned"] = True
    return True


def malloc_description() -> str:
    """'glibc <version>, tuned' / 'glibc <version>, default' / 'not glibc' (for reports)."""
    version = glibc_version()
    if version is None:
        return "not glibc"
    return f"glibc {version}, {'tuned' if _state['tuned'] else 'default'}"


def accelerator_plugins() -> list[str]:
    """Installed JAX accelerator backends: known plugin modules and `jax_plugins` entry points."""
    found = [m for m in _ACCELERATOR_MODULES if importlib.util.find_spec(m) is not None]
    found += [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
    return sorted(set(found))


def cpu_only() -> bool:
    """True when JAX will compute on the CPU alone, decided without initialising JAX.

    `JAX_PLATFORMS` (or the older `JAX_PLATFORM_NAME`), when set, decides: only "cpu" listed.
    Otherwise: no accelerator plugin installed (`accelerator_plugins`).
    """
    platforms = os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME") or ""
    names = {name.strip().lower() for name in platforms.split(",") if name.strip()}
    if names:
        return names == {"cpu"}
    return not accelerator_plugins()


def tpu_devices_present(dev: str = "/dev") -> bool:
    """Whether this host has TPU chips: `/dev/accel*` (TPU v2-v5e) or `/dev/vfio/<n>` (v5p,
    v6e), the device files libtpu opens."""
    root = pathlib.Path(dev)
    vfio = root / "vfio"
    numbered = vfio.is_dir() and any(p.name.isdigit() for p in vfio.iterdir())
    return numbered or any(root.glob("accel*"))


def cpu_unless_tpu(environ=os.environ, plugins: list[str] | None = None, dev: str = "/dev") -> bool:
    """Sets JAX_PLATFORMS=cpu in `environ` where libtpu is the only accelerator backend
    installed but the host has no TPU (`tpu_devices_present`); returns whether it did.

    Otherwise JAX starts libtpu, which probes the cloud metadata server and prints start-up
    errors ("could not determine TPU accelerator type", "unexpected worker hostname") before
    falling back to the CPU, and `cpu_only()` cannot tell the run will be on the CPU (the
    allocator then stays untuned). A host with TPU chips, a GPU plugin, or JAX_PLATFORMS (or
    JAX_PLATFORM_NAME) already set is left alone. Call it before JAX is imported; the entry
    points (`experiments.cli.main`) do, and processes they start inherit the setting.
    """
    if environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME"):
        return False
    plugins = accelerator_plugins() if plugins is None else plugins
    if plugins != ["libtpu"] or tpu_devices_present(dev):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


def should_tune_malloc(requested: bool | None) -> bool:
    """The command-line tools' choice: `requested` if given, else glibc and `cpu_only()`."""
    if requested is not None:
        return requested
    return glibc_version() is not None and cpu_only()


def process_seconds() -> float | None:
    """Seconds since this process started, from Linux's /proc (to 1 / SC_CLK_TCK, usually 10 ms);
    None where /proc is not there (macOS, Windows)."""
    try:
        stat = pathlib.Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None
