"""The training loop (tfjax.runs.loop) with stub hooks: what it does at each step and in which
order, SIGTERM, the final save; and the hooks of both its callers (a run, a vectorised sweep)."""

import logging

import jax
import numpy as np
import pytest

from tfjax.runs import loop, trainer, vsweep
from tfjax.training import checkpointing


class _Train:
    """The `train` config group's schedule (what the loop reads of it)."""

    num_train_steps = 6
    log_every_steps = 2
    eval_every_steps = 3
    checkpoint_every_steps = 4


class _Recorder:
    """Hooks that record what the loop asks; the state is a number each step adds 1 to, which
    `adjust` adds 100 to at step 3; `save` writes it to a real checkpointer."""

    def __init__(self, checkpointer, stop_at=None, preemption=None):
        self.checkpointer, self.calls = checkpointer, []
        self.stop_at, self.preemption = stop_at, preemption

    def place(self, state):
        self.calls.append(("place", state))
        return state

    def batch(self):
        return {}

    def step(self, state, batch):
        if self.preemption is not None and state + 1 == self.stop_at:
            self.preemption.requested = True  # what the SIGTERM handler does
        return state + 1, {"state": np.float32(state + 1)}

    def startup(self, step, record):
        assert set(record) >= {"first_step_seconds"}
        self.calls.append(("startup", step))

    def log(self, pending, step, t0, untimed):
        self.calls.append(("log", step, [float(m["state"]) for m in pending], untimed))
        return {"loss": 1.0}

    def evaluate(self, state, step):
        self.calls.append(("evaluate", step, state))

    def adjust(self, state, step):
        self.calls.append(("adjust", step))
        return state + 100 if step == 3 else state

    def save(self, state, step, pending):
        self.calls.append(("save", step, state, len(pending)))
        self.checkpointer.save(
            step,
            {"state": np.float32(state)},
            rng=jax.random.key(0),
            data_state={},
            config={},
            force=True,
        )


def _run(tmp_path, start=0, state=0, stop_at=None):
    with checkpointing.Checkpointer(tmp_path / "checkpoints", async_save=False) as checkpointer:
        preemption = loop.Preemption()
        hooks = _Recorder(checkpointer, stop_at, preemption)
        if start:
            hooks.save(state, start, [])
            hooks.calls.clear()
        steps = loop.Loop(hooks, _Train(), checkpointer, step=start)
        state, step = steps.run(state, start, preemption)
        return hooks, state, step, steps.step


def test_each_step_logs_evaluates_adjusts_and_saves_in_order(tmp_path):
    hooks, state, step, last = _run(tmp_path)
    assert (step, last, state) == (6, 6, 106)  # adjust's state is the one the next step takes
    assert hooks.calls == [
        ("place", 0),
        ("startup", 1),
        ("adjust", 1),
        ("log", 2, [1.0, 2.0], 1),  # the first window: its first step compiled, untimed
        ("adjust", 2),
        ("evaluate", 3, 3),
        ("adjust", 3),  # after the evaluation of its step
        ("log", 4, [3.0, 104.0], 0),
        ("adjust", 4),
        ("save", 4, 104, 0),  # after the adjustment: the checkpoint holds the adjusted state
        ("adjust", 5),
        ("log", 6, [105.0, 106.0], 0),
        ("evaluate", 6, 106),
        ("adjust", 6),
        ("save", 6, 106, 0),  # the last step, off the checkpoint schedule: saved at the end
    ]


def test_a_sigterm_saves_at_its_step_and_stops(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        hooks, state, step, _ = _run(tmp_path, stop_at=3)
    assert (step, state) == (3, 103)
    assert [c for c in hooks.calls if c[0] == "save"] == [("save", 3, 103, 1)]  # 3: not logged
    assert "stopped at step 3 by SIGTERM; rerun the same command to resume" in caplog.text


def test_a_resumed_run_steps_from_its_checkpoint_and_a_finished_one_saves_nothing(tmp_path):
    hooks, state, step, _ = _run(tmp_path, start=4, state=104)
    assert (step, state) == (6, 106)
    assert hooks.calls[:2] == [("place", 104), ("startup", 5)]  # the first step run: 5
    assert ("log", 6, [105.0, 106.0], 1) in hooks.calls  # 5 compiled: untimed
    hooks, state, step, _ = _run(tmp_path / "finished", start=6, state=106)
    assert (step, state) == (6, 106) and hooks.calls == [("place", 106)]


@pytest.mark.parametrize("hooks", [trainer._RunHooks, vsweep._GroupHooks])
def test_a_run_and_a_vectorised_sweep_train_through_the_loop_with_hooks(hooks):
    assert isinstance(object.__new__(hooks), loop.Hooks)
