"""What a training run leaves for the tools researchers bring: a `jax.profiler` trace of
`train.profile_steps` for TensorBoard's profile plugin or XProf, a start-up line with the
parameter count, and the TensorBoard scalars that `wandb.init(sync_tensorboard=True)` syncs
(docs/training.md, "Profiling" and "Weights & Biases")."""

import gzip
import json
import logging
import math

import jax
import numpy as np
import pytest
import test_workdir_format
from test_logger import _tensorboard_scalars

from experiments import config_utils
from tfjax import errors
from tfjax.runs import restoration, trainer, validation, workdir_format
from tfjax.training import logger, profiling

STEPS = 4
WINDOW = (2, 3)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, tfjax's log lines) of a tiny run of 4 steps that traces steps 2 and 3."""
    workdir = tmp_path_factory.mktemp("profiled")
    overrides = [
        f"train.num_train_steps={STEPS}",
        "train.log_every_steps=1",
        "train.eval_every_steps=0",
        "train.profile_steps={},{}".format(*WINDOW),
    ]
    config = config_utils.load_config("configs/classify.py:tiny", overrides)
    lines, tfjax_log = _Lines(), logging.getLogger("tfjax")
    level = tfjax_log.level
    tfjax_log.addHandler(lines)
    tfjax_log.setLevel(logging.INFO)
    try:
        trainer.train_and_evaluate(config, workdir)
    finally:
        tfjax_log.removeHandler(lines)
        tfjax_log.setLevel(level)
    return workdir, lines.lines


def _calls(events: list[dict], name: str) -> int:
    """Calls of `name` in a Chrome trace: its complete events not nested in another of them."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == name)
    calls, end = 0, -math.inf
    for start, stop in spans:
        if start >= end:
            calls, end = calls + 1, stop
    return calls


def test_profile_steps_writes_a_trace_of_those_steps_only(run):
    workdir, lines = run
    (trace,) = (workdir / profiling.PROFILE_DIR).glob("plugins/profile/*/*.xplane.pb")
    assert trace.stat().st_size > 0  # what TensorBoard's profile plugin and XProf read
    (chrome,) = trace.parent.glob("*.trace.json.gz")
    events = json.loads(gzip.decompress(chrome.read_bytes()))["traceEvents"]
    assert _calls(events, "PjitFunction(step)") == WINDOW[1] - WINDOW[0] + 1  # not 1 or 4
    assert any(line.startswith("profile written to ") for line in lines)


def test_a_run_logs_its_parameter_count(run):
    workdir, lines = run
    config = workdir_format.load_config_json(workdir / "config.json")
    params = restoration.restore(config, workdir)[1].state.params
    count = sum(np.size(leaf) for leaf in jax.tree.leaves(params))
    assert f"model encoder_only: {count:,} parameters" in lines


def test_the_tensorboard_events_hold_every_logged_scalar(run):
    """What W&B's sync_tensorboard uploads is the event files: every number of metrics.jsonl
    is there, under `kind/name` at its step."""
    workdir, _ = run
    scalars = _tensorboard_scalars(workdir)
    records = logger.read_metrics(workdir)
    assert {r["kind"] for r in records} >= {"startup", "train", "final_eval"}
    expected = {
        (f"{r['kind']}/{name}", r["step"], value)
        for r in records
        for name, value in r.items()
        if name not in ("step", "kind")
    }
    assert len(expected) > 20
    for tag, step, value in expected:
        assert tag in scalars, tag
        (logged,) = [v for s, v in scalars[tag] if s == step]
        assert logged == pytest.approx(value, rel=1e-6), (tag, step)
    assert sum(len(v) for v in scalars.values()) == len(expected)  # and nothing else


@pytest.mark.parametrize("steps", [(), [], (1, 1), (3, 10)])
def test_profile_steps_take_nothing_or_first_and_last(steps):
    assert profiling.check_steps(steps) == (tuple(steps) or None)


@pytest.mark.parametrize("steps", [(3,), (0, 2), (5, 4), (1, 2, 3), (1.0, 2), (True, 2)])
def test_other_profile_steps_are_refused_in_one_line(steps):
    config = config_utils.load_config("configs/base.py:tiny")
    with config.unlocked():
        config.train.profile_steps = steps
    with pytest.raises(errors.ConfigError, match=r"train\.profile_steps must be \(\) or FIRST"):
        validation.check_config(config)


def test_a_workdir_saved_before_profile_steps_is_refused_in_one_line(tmp_path):
    config = config_utils.load_config("configs/base.py:tiny")
    tree = workdir_format.config_dict(config)
    del tree["train"]["profile_steps"]
    test_workdir_format.write_older(tmp_path / "config.json", tree)
    test_workdir_format.assert_refused(tmp_path / "config.json")
