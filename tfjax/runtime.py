"""Process-level settings for running on a CPU host: the glibc allocator.

XLA:CPU asks for one temporary buffer per execution of a compiled program (about 640 MB for the
benchmark train step, `experiments/bench.py`), frees it when the step ends, and does so from its
worker threads. glibc serves an allocation that large from a fresh `mmap` and returns it with
`munmap` on free, so every step touches ~160,000 new pages: measured here, a fifth of each train
step went to page faults (0.44 s of system time in a 1.16 s step).

`tune_glibc_malloc()` keeps that memory in the process instead (glibc's `mallopt`): one arena for
all threads (worker-thread arenas always `mmap` large blocks), no `mmap` for large blocks, no
trimming of the heap, and a generous top pad. It is opt-in (`experiments.train --tune_malloc`,
`experiments.bench --tune_malloc`), because it changes the whole process: freed memory stays
resident (peak RSS, not current use, becomes the footprint) and every thread shares one arena.

It must run before the first JAX computation: threads that already allocated keep their own
arenas and the tuning no longer reaches them. The same settings as environment variables, for a
process you launch yourself: `MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=2147483647 MALLOC_TOP_PAD_=1073741824`.
"""

import ctypes
import ctypes.util
import functools

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
