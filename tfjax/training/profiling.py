"""A `jax.profiler` trace of chosen training steps, for TensorBoard's profile plugin or XProf.

`train.profile_steps=FIRST,LAST` traces steps FIRST to LAST, numbered as `metrics.jsonl`
numbers them (the first step of a run is 1), with what the loop does at them (logging,
evaluation, saving), into `WORKDIR/profile` (`plugins/profile/<time>/<host>.xplane.pb`);
`()` traces nothing. A run resumed inside the window traces its remaining steps. How to open the
trace: docs/training.md, "Profiling".
"""

import logging
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax

from tfjax import errors

log = logging.getLogger(__name__)

PROFILE_DIR = "profile"  # under the workdir


def check_steps(steps: Sequence[object]) -> tuple[int, int] | None:
    """`train.profile_steps` as (first, last), or None when it is empty (no trace).

    Raises:
        tfjax.errors.ConfigError: unless `steps` is empty or two integers
            1 <= first <= last.
    """
    steps = tuple(steps)
    if not steps:
        return None
    integers = all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    if len(steps) != 2 or not integers or not 1 <= steps[0] <= steps[1]:
        raise errors.ConfigError(
            f"train.profile_steps must be () or FIRST,LAST with 1 <= FIRST <= LAST, got "
            f"{steps!r}; e.g. --config.train.profile_steps=10,12 traces steps 10, 11 and 12"
        )
    return steps


class StepTrace:
    """The trace of one run's window of steps; a context manager around the step loop.

    On entry it starts tracing when the run's next step (`start + 1`) is in the window; the
    loop then calls `step_done(step, state)` after each step and its logging, evaluation and
    saving. The trace stops, after waiting for `state`, once the window's last step is done,
    or at the exit (a run that ends or is stopped inside the window).

    Args:
        steps: `train.profile_steps`: () or (first, last).
        directory: where the trace goes (`WORKDIR/profile`).
        start: the step the run starts from (0, or the restored checkpoint's).
        enabled: False traces nothing (the processes of a multi-process run but process 0).
    """

    def __init__(
        self,
        steps: Sequence[object],
        directory: str | pathlib.Path,
        *,
        start: int = 0,
        enabled: bool = True,
    ):
        self.window = check_steps(steps) if enabled else None
        self.directory = pathlib.Path(directory)
        self.start = start
        self.active = False

    def __enter__(self) -> "StepTrace":
        self.step_done(self.start, None)
        return self

    def step_done(self, step: int, state: Any) -> float:
        """After step `step` (and what the loop did at it): stops the trace at the window's
        last step, starts it when the next step is the window's first (or inside the window
        at the run's start). Returns the seconds that took, for the loop to leave out of its
        tokens/s as it does evaluations (0.0 when it did nothing)."""
        if self.window is None:
            return 0.0
        began, (first, last) = time.perf_counter(), self.window
        if self.active and step >= last:
            self._stop(state)
        elif not self.active and first <= step + 1 <= last:
            jax.block_until_ready(state)  # the steps before stay out of the trace
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True
        return time.perf_counter() - began

    def _stop(self, state: Any) -> None:
        jax.block_until_ready(state)  # the last step's device work is in the trace
        jax.profiler.stop_trace()
        self.active = False
        log.info(
            "profile written to %s (tensorboard --logdir=%s)", self.directory, self.directory.parent
        )

    def __exit__(self, *exc) -> None:
        if self.active:
            self._stop(None)
