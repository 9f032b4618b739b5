"""The training loop, one for a run (`tfjax.runs.trainer`) and for a vectorised sweep's trials
(`tfjax.runs.vsweep`): step, log, evaluate, adjust and save on the `train` config's schedule.

What differs between the two lives in a `Hooks` object: where the batches come from, how the
compiled step is called, where the records go (one `metrics.jsonl`, or one per trial), what an
evaluation covers, what a checkpoint holds, and `adjust`, the place where a caller changes the
state between steps (the sweep's successive halving; population-based training would go there
too). The loop owns the order and the clock, the same for every caller. At each step:

1. `hooks.batch()`, then `hooks.step(state, batch)`, the compiled step (dispatched
   asynchronously); then the SIGTERM check (`preemption.check`);
2. at the run's first step: waits for the step and hands `hooks.startup` the "startup" record
   (`startup_record`: the compiled step stays out of tokens/s);
3. every `train.log_every_steps` and at the last step: `hooks.log` with the steps since the
   last log (the only place the loop waits on the devices);
4. every `train.eval_every_steps`: `hooks.evaluate` (its time is not train time);
5. `hooks.adjust(state, step)`;
6. every `train.checkpoint_every_steps`, and after a SIGTERM: `hooks.save`;
7. the profiler trace's bookkeeping, if there is one (`tfjax.training.profiling`).

A SIGTERM (`Preemption`) ends the loop after the step it came in, once 6 has saved that step;
otherwise the last step is saved at the end unless its checkpoint exists. The sweep passes no
profiler trace: `train.profile_steps` traces a run alone.
"""

import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from tfjax.parallel import distributed
from tfjax.training import checkpointing, host, logger, profiling

log = logging.getLogger(__name__)


class Terminated(BaseException):
    """SIGTERM before the training loop started (see `Preemption`).

    A BaseException, as KeyboardInterrupt is, so that no `except Exception` on its way (a
    checkpoint read that may fail) takes it for an error of its own.
    """


class Preemption:
    """Turns SIGTERM into a flag the loop checks after every step (`check`).

    One process: a signal handler sets it (main thread only). Several: JAX's preemption service
    catches the SIGTERM of any process and `check` turns True in all of them at the same step.
    With `early=True` the handler goes in before the loop, while the run is built, restored and
    compiled: until `start()`, a SIGTERM raises `Terminated` at once (nothing is being saved
    then), and `release()` gives SIGTERM back once the loop is over.
    """

    def __init__(self, *, early: bool = False):
        self.requested = False
        self.started = not early
        self._previous = None
        self._agreed = jax.process_count() > 1

    def __enter__(self):
        if self._agreed:
            return self  # a handler of our own would replace JAX's
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def check(self, step: int) -> bool:
        """Whether to save and stop after `step` (call once per step, in every process)."""
        if self._agreed and not self.requested and distributed.preemption_agreed(step):
            log.warning("SIGTERM received by a process of this job: saving and stopping")
            self.requested = True
        return self.requested

    def start(self) -> None:
        """The loop begins: from now on a SIGTERM saves a checkpoint and stops.

        Raises:
          Terminated: when a SIGTERM came earlier but its `Terminated` never got out. The handler
            runs wherever the main thread is, and where that is a garbage-collector callback
            (JAX registers one) or a `__del__`, Python prints the exception and goes on.
        """
        if self.requested:
            raise Terminated
        self.started = True

    def _handle(self, signum, frame):
        if not self.started:
            self.requested = True  # for `start`, should the exception be swallowed
            raise Terminated
        log.warning("SIGTERM received: saving a checkpoint and stopping")
        self.requested = True

    def release(self) -> None:
        """Gives SIGTERM back to the handler it had before `__enter__` (once)."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def __exit__(self, *exc):
        self.release()


@runtime_checkable
class Hooks(Protocol):
    """What the loop asks of what it trains. `pending` is the steps' metrics since the last log
    (device arrays, as the steps returned them)."""

    def place(self, state: Any) -> Any:
        """The state where the step wants it (on the devices, sharded), before the first step."""

    def batch(self) -> Any:
        """The next batch, on the devices."""

    def step(self, state: Any, batch: Any) -> tuple[Any, Any]:
        """Runs the compiled step: (new state, metrics)."""

    def startup(self, step: int, record: Mapping[str, float]) -> None:
        """Logs the "startup" record of the first step (`startup_record`)."""

    def log(self, pending: list, step: int, t0: float, untimed: int) -> Mapping | None:
        """Logs `pending`, the steps up to `step` run since `time.perf_counter()` was `t0`, the
        first `untimed` of them not timed (compilation); returns what the progress display
        shows (None: nothing). Raises `tfjax.errors.DivergedError` to stop the run."""

    def evaluate(self, state: Any, step: int) -> None:
        """Logs a periodic evaluation."""

    def adjust(self, state: Any, step: int) -> Any:
        """The state the next step starts from (after this step's evaluation)."""

    def save(self, state: Any, step: int, pending: list) -> None:
        """Checkpoints `state` as `step` (the steps in `pending` not logged yet)."""


@dataclasses.dataclass
class Loop:
    """Trains through `hooks` on the schedule of `config` (the `train` config group).

    Attributes:
        hooks: what is trained (`Hooks`).
        config: the `train` config group: `num_train_steps` and the `*_every_steps`.
        checkpointer: where `hooks.save` saves; the loop asks it for the latest step.
        step: the step started last (dispatch is asynchronous), for messages.
        chief: False shows no progress (the processes of a multi-process run but 0).
    """

    hooks: Hooks
    config: Any
    checkpointer: checkpointing.Checkpointer
    step: int = 0
    chief: bool = True

    def run(
        self,
        state: Any,
        start: int,
        preemption: Preemption,
        trace: profiling.StepTrace | None = None,
    ) -> tuple[Any, int]:
        """Steps from `start` to `num_train_steps` or a SIGTERM, then saves the last step.

        Args:
            state: the state restored or created for step `start`.
            start: the step the run starts from (0, or the restored checkpoint's).
            preemption: entered; `start()`ed here (a SIGTERM then saves a checkpoint and
                stops) and released once the steps are over (a SIGTERM in the final save and
                evaluation ends the process).
            trace: a profiler trace of chosen steps (`train.profile_steps`), or None.

        Returns:
            (state, step): the state after the last step run, and that step. Check
            `preemption.requested` for a run stopped by SIGTERM (the loop has logged where).
        """
        preemption.start()
        with trace if trace is not None else contextlib.nullcontext():
            state, step, pending = self._steps(state, start, preemption, trace)
        preemption.release()  # a SIGTERM in the final save and evaluation ends the process
        if preemption.requested:
            log.warning("stopped at step %d by SIGTERM; rerun the same command to resume", step)
        elif self.checkpointer.latest_step() != step:
            self.hooks.save(state, step, pending)
        return state, step

    def _steps(self, state, start: int, preemption, trace):
        hooks, tcfg = self.hooks, self.config
        state = hooks.place(state)
        progress = logger.Progress(tcfg.num_train_steps, initial_step=start, enabled=self.chief)
        pending, t0, step = [], time.perf_counter(), start
        while step < tcfg.num_train_steps and not preemption.requested:
            batch = hooks.batch()
            called = time.perf_counter()
            state, metrics = hooks.step(state, batch)
            step = self.step = step + 1
            preemption.check(step)
            if step == start + 1:  # keep compilation (step and tokens) out of tokens/s
                jax.block_until_ready(metrics)
                t0 = time.perf_counter()
                hooks.startup(step, startup_record(t0 - called))
            pending.append(metrics)
            if step % tcfg.log_every_steps == 0 or step == tcfg.num_train_steps:
                untimed = 1 if len(pending) == step - start else 0  # the first window
                shown = hooks.log(pending, step, t0, untimed)
                if shown is not None:
                    progress.update(step, shown)
                pending, t0 = [], time.perf_counter()
            if tcfg.eval_every_steps and step % tcfg.eval_every_steps == 0:
                began = time.perf_counter()
                hooks.evaluate(state, step)
                t0 += time.perf_counter() - began  # evaluation time is not train time
            state = hooks.adjust(state, step)
            if step % tcfg.checkpoint_every_steps == 0 or preemption.requested:
                hooks.save(state, step, pending)
            if trace is not None:
                t0 += trace.step_done(step, state)  # nor is starting or stopping a trace
        progress.close()
        return state, step, pending


def startup_record(first_step: float) -> dict[str, float]:
    """The "startup" record a run writes at its first step (and logs in one line):
    `first_step_seconds`, the first step's call to its result (tracing, compiling or reading
    the compilation cache, and the step), and on Linux `process_seconds`, the process's start
    to that result (imports, data, model, restore and the first step)."""
    record = {"first_step_seconds": first_step}
    since_start = host.process_seconds()
    if since_start is not None:
        record["process_seconds"] = since_start
    log.info(
        "first step done in %.1f s (compile and run)%s",
        first_step,
        "" if since_start is None else f", {since_start:.1f} s after the process started",
    )
    return record


def drop_replayed(writers: Sequence[logger.MetricWriter], start: int) -> None:
    """Drops each writer's records after `start`, the step the run resumes from (all of them
    when it starts afresh): the steps it logs again (`MetricWriter.drop_after`)."""
    dropped = sum(writer.drop_after(start) for writer in writers)
    if dropped:
        log.info("metrics.jsonl: dropped %d records after step %d (logged again)", dropped, start)
