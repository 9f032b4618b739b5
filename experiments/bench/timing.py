"""Wall-clock timers of the benchmarks: warm-up, repeats, alternating pairs and rate statistics.

Every timer waits for a call's JAX outputs (`jax.block_until_ready`); a call that returns plain
Python values (the torch peer's step returns `loss.item()`) is synchronous already.
"""

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds of one call of `fn`, waiting for its (jax) outputs."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def warm_up(fn: Callable[[], Any], warmup: int) -> float:
    """Calls `fn` `warmup` times, untimed but for the first (incl. compilation); returns that."""
    first = time_once(fn)
    for _ in range(warmup - 1):
        time_once(fn)
    return first


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    """(first call incl. compilation, [seconds per timed call]) after `warmup` untimed calls."""
    first = warm_up(fn, warmup)
    return first, [time_once(fn) for _ in range(repeats)]


def time_pairs(
    fn: Callable[[], Any], peer_fn: Callable[[], Any], repeats: int, warmup: int = 1
) -> tuple[float, list[float], list[float]]:
    """(first `fn` call incl. compilation, [fn seconds], [peer_fn seconds]) over alternating pairs.

    After `warmup` untimed calls of each, pair i times one call of each: `fn` first when i is
    even, `peer_fn` first when i is odd, so that neither side always runs right after the other.
    """
    first = warm_up(fn, warmup)
    warm_up(peer_fn, warmup)
    times, peer_times = [], []
    for i in range(repeats):
        if i % 2 == 0:
            times.append(time_once(fn))
            peer_times.append(time_once(peer_fn))
        else:
            peer_times.append(time_once(peer_fn))
            times.append(time_once(fn))
    return first, times, peer_times


# Timed calls split into two modes where consecutive sorted times jump by at least this factor.
MODE_GAP = 1.5


def modes(times: list[float], gap: float = MODE_GAP) -> dict | None:
    """The two modes of bimodal timings, or None when the times form one group.

    The times are sorted and cut at the largest ratio between neighbours; when that ratio is at
    least `gap` (1.5: on a quiet host repeats of one step stay within ~10%), the line reports
    both groups instead of letting a median or min-max hide them: {"fast": {"count",
    "median_seconds"}, "slow": {..., "calls": indices of the slow calls in timed order},
    "gap": the ratio at the cut}.
    """
    if len(times) < 2:
        return None
    order = sorted(range(len(times)), key=times.__getitem__)
    ratios = [times[order[i + 1]] / times[order[i]] for i in range(len(order) - 1)]
    cut = max(range(len(ratios)), key=ratios.__getitem__)
    if ratios[cut] < gap:
        return None
    fast, slow = order[: cut + 1], order[cut + 1 :]

    def group(calls: list[int]) -> dict:
        return {"count": len(calls), "median_seconds": statistics.median(times[c] for c in calls)}

    return {"fast": group(fast), "slow": {**group(slow), "calls": sorted(slow)}, "gap": ratios[cut]}


def rates(amount: float, times: list[float]) -> dict:
    """{"median", "min", "max"} of `amount` / seconds over the timed calls (e.g. tokens/s), and
    "modes": `modes(times)` (None unless the calls fall into a fast and a slow group)."""
    per_call = [amount / t for t in times]
    return {
        "median": statistics.median(per_call),
        "min": min(per_call),
        "max": max(per_call),
        "modes": modes(times),
    }
