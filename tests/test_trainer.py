"""End-to-end tests of train_and_evaluate: checkpoints, exact resume, NaN stop, config checks,
the workdir lock."""

import json
import logging
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
import test_workdir_format
from tiny_runs import REVERSE

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import pipeline
from tfjax.runs import build, evaluator, lock, restoration, run_data, trainer, workdir_format
from tfjax.training import checkpointing, logger, optim
from tfjax.training import steps as train_steps


def _config(spec="configs/base.py:tiny", *overrides):
    return config_utils.load_config(spec, list(overrides))


def _restore(workdir: pathlib.Path, step=None):
    config = workdir_format.load_config_json(workdir / "config.json")
    return restoration.restore(config, workdir, step)[1]


def _params(workdir, step=None):
    return jax.tree.map(np.asarray, _restore(workdir, step).state.params)


@pytest.mark.parametrize(
    "spec", ["configs/base.py:tiny", "configs/lm.py:tiny", "configs/classify.py:tiny"]
)
def test_tiny_run_writes_config_metrics_and_checkpoints(spec, tmp_path):
    config = _config(spec, "train.num_train_steps=4")
    result = trainer.train_and_evaluate(config, tmp_path)
    assert np.isfinite(result["loss"])
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"] == config.model.to_dict()
    kinds = {record["kind"] for record in logger.read_metrics(tmp_path)}
    assert {"startup", "train", "eval", "final_eval"} <= kinds
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert _restore(tmp_path).step == 4


@pytest.mark.slow  # 8 s; resuming bit-exactly stays default in test_muon and test_disk_faults
def test_resume_after_a_crash_between_saves_is_bit_exact(tmp_path, monkeypatch):
    # Reference: 6 uninterrupted steps.
    config = _config("configs/base.py:tiny", *REVERSE, "train.num_train_steps=6")
    trainer.train_and_evaluate(config, tmp_path / "straight")
    # Same run, crashing after step 5 (checkpoint at 4): the rerun restores step 4 and replays.
    original_next = pipeline.BatchIterator.__next__
    calls = {"n": 0}

    def crash_after_five(self):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt("simulated kill")
        return original_next(self)

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", crash_after_five)
    with pytest.raises(KeyboardInterrupt):
        trainer.train_and_evaluate(config, tmp_path / "crashed")
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", original_next)
    assert _restore(tmp_path / "crashed").step == 4
    assert lock.read_holder(tmp_path / "crashed") is None  # released on KeyboardInterrupt
    trainer.train_and_evaluate(config, tmp_path / "crashed")

    straight, resumed = _params(tmp_path / "straight"), _params(tmp_path / "crashed")
    jax.tree.map(np.testing.assert_array_equal, straight, resumed)
    last = [logger.read_metrics(tmp_path / run, "train")[-1] for run in ("straight", "crashed")]
    assert last[0]["loss"] == last[1]["loss"] and last[0]["step"] == last[1]["step"] == 6
    # One "startup" record per run at its first step: the fresh run's, and the resumed one's.
    for run, steps in (("straight", [1]), ("crashed", [1, 5])):
        startups = logger.read_metrics(tmp_path / run, "startup")
        assert [r["step"] for r in startups] == steps
        assert all(0 < r["first_step_seconds"] <= r["process_seconds"] for r in startups)


@pytest.mark.slow
def test_a_workdir_trained_under_pmap_resumes_under_sharded(tmp_path):
    """The default mode changed from pmap to sharded: a pmap workdir goes on under the new
    default and ends where a run in one mode ends (no dropout: the modes split its keys apart)."""
    flags = (*REVERSE, "model.dropout_rate=0.0", "train.log_every_steps=1")
    flags = (*flags, "train.num_train_steps=6")
    trainer.train_and_evaluate(_config("configs/base.py:tiny", *flags), tmp_path / "straight")
    first = _config("configs/base.py:tiny", *flags[:-1], "train.num_train_steps=4")
    first.unlock().parallel.mode = "pmap"
    trainer.train_and_evaluate(first, tmp_path / "switched")
    saved = json.loads((tmp_path / "switched" / "config.json").read_text())
    assert saved["parallel"]["mode"] == "pmap"
    second = _config("configs/base.py:tiny", *flags)
    assert second.parallel.mode == "sharded"
    trainer.train_and_evaluate(second, tmp_path / "switched")
    # Losses, not parameters: the key projections' biases get gradients of pure rounding
    # noise (softmax ignores them), which Adam scales up differently in the two programs.
    runs = [logger.read_metrics(tmp_path / run) for run in ("straight", "switched")]
    kept = [("train", step) for step in range(1, 7)] + [("final_eval", 6)]
    losses = [
        [(r["kind"], r["step"], r["loss"]) for r in records if (r["kind"], r["step"]) in kept]
        for records in runs
    ]
    assert [x[:2] for x in losses[0]] == [x[:2] for x in losses[1]] == kept
    np.testing.assert_allclose([x[2] for x in losses[1]], [x[2] for x in losses[0]], rtol=1e-5)


@pytest.mark.slow
def test_resuming_with_the_other_scan_layout_converts_the_checkpoint(tmp_path):
    # Without dropout the two layouts compute the same steps (to float32 rounding).
    flags = ("model.num_layers=2", "model.dropout_rate=0.0", "train.num_train_steps=6")
    trainer.train_and_evaluate(_config("configs/lm.py:tiny", *flags), tmp_path / "straight")
    first = _config("configs/lm.py:tiny", *flags[:2], "train.num_train_steps=4")
    trainer.train_and_evaluate(first, tmp_path / "switched")
    scanned = _config("configs/lm.py:tiny", *flags, "model.scan_layers=True")
    trainer.train_and_evaluate(scanned, tmp_path / "switched")  # resumes at 4, not refused
    assert "layers" in _restore(tmp_path / "switched").state.params["decoder"]
    unscanned = _config("configs/lm.py:tiny", *flags)
    restored = restoration.restore(unscanned, tmp_path / "switched")[1]
    assert restored.step == 6
    # Adam's eps (1e-9) turns float32 rounding in near-zero gradients (rare tokens' embedding
    # rows) into full-size steps, so compare the whole model and the losses, not every element.
    got, want = jax.tree.map(np.asarray, restored.state.params), _params(tmp_path / "straight")
    diff = optax.tree.norm(jax.tree.map(np.subtract, got, want))
    assert diff < 1e-3 * optax.tree.norm(want), diff
    losses = [
        logger.read_metrics(tmp_path / r, "train")[-1]["loss"] for r in ("straight", "switched")
    ]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


# (update that first makes the parameters NaN, the last good checkpoint): logging every 2 steps
# and saving every 4, the NaN of update 5 shows in the loss logged at step 6; those of updates 4
# and 8 come on a checkpoint step, after the metrics the loop logs there (the step's loss and
# gradient come before its update), so only a check of the saved state itself sees them.
@pytest.mark.parametrize(
    "first_nan, last_good", [(5, 4), (4, None), pytest.param(8, 4, marks=pytest.mark.slow)]
)
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(
    first_nan, last_good, tmp_path, monkeypatch
):
    real = optim.make_optimizer

    def poisoned(config, d_model, multipliers=None):
        optimizer, schedule = real(config, d_model, multipliers)

        def update(updates, state, params=None):
            updates, inner = optimizer.update(updates, state[0], params)
            poison = jnp_nan_if(state[1] == first_nan - 1)  # makes every parameter NaN
            return jax.tree.map(lambda u: u + poison, updates), (inner, state[1] + 1)

        def init(params):
            return optimizer.init(params), jax.numpy.zeros((), jax.numpy.int32)

        return optax.GradientTransformation(init, update), schedule

    def jnp_nan_if(condition):
        return jax.numpy.where(condition, jax.numpy.nan, 0.0)

    monkeypatch.setattr(optim, "make_optimizer", poisoned)
    config = _config(
        "configs/base.py:tiny", *REVERSE, "train.num_train_steps=8", "train.eval_every_steps=0"
    )
    assert (config.train.log_every_steps, config.train.checkpoint_every_steps) == (2, 4)
    kept = "none saved yet" if last_good is None else f"last good checkpoint is step {last_good}"
    with pytest.raises(errors.DivergedError, match=kept):
        trainer.train_and_evaluate(config, tmp_path)
    assert workdir_format.saved_steps(tmp_path) == ([] if last_good is None else [last_good])
    if last_good is not None:  # what a rerun resumes from
        assert _restore(tmp_path).step == last_good
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(tmp_path)))


def test_the_logged_learning_rate_advances_once_per_accumulated_update():
    # With grad_accum_steps=k the optimizer applies one update per k steps and the schedule
    # advances with the applied updates: step t (from 1) logs the paper's LR at
    # s = (t - 1) // k + 1 (the updates applied before it, plus one).
    k, d_model, warmup = 3, 32, 10
    config = _config(
        "configs/base.py:tiny",
        *REVERSE,
        f"optim.grad_accum_steps={k}",
        f"model.embed_dim={d_model}",
        f"optim.warmup_steps={warmup}",
        "optim.schedule=paper",
        "optim.learning_rate=1.0",
    )
    model_config = build.make_model_config(config, 16)
    model = models.create_model(model_config)
    optimizer, schedule = build.make_optimizer(config, model_config)
    step = jax.jit(build.make_train_step(config, model, optimizer, schedule))
    batch = {key: np.ones_like(x) for key, x in run_data.sample_batch(config).items()}
    state = jax.jit(
        lambda: train_steps.create_train_state(
            model, optimizer, jax.random.key(0), batch, model_config.kind
        )
    )()
    for t in range(1, 7):
        state, metrics = step(state, batch, jax.random.key(1))
        s = (t - 1) // k + 1
        want = d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)
        np.testing.assert_allclose(metrics["learning_rate"], want, rtol=1e-6, err_msg=f"step {t}")


def test_a_workdir_from_another_model_is_refused_and_kept(tmp_path):
    first = _config("configs/base.py:tiny", *REVERSE, "train.num_train_steps=4")
    trainer.train_and_evaluate(first, tmp_path)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    other = _config(
        "configs/base.py:tiny", *REVERSE, "model.embed_dim=64", "train.num_train_steps=8"
    )
    with pytest.raises(ValueError, match="embed_dim"):
        trainer.train_and_evaluate(other, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert _restore(tmp_path).step == 4


@pytest.mark.slow
def test_a_workdir_from_before_new_options_is_refused_in_one_line(tmp_path):
    trainer.train_and_evaluate(
        _config("configs/base.py:tiny", *REVERSE, "train.num_train_steps=4"), tmp_path
    )
    for copy in (tmp_path / "checkpoints").glob(f"*/{checkpointing.CONFIG_COPY}"):
        config = json.loads(copy.read_text())  # as written before tfjax had final_dropout
        del config["model"]["final_dropout"]
        test_workdir_format.write_older(copy, config)
    longer = _config("configs/base.py:tiny", *REVERSE, "train.num_train_steps=6")
    before = workdir_format.saved_steps(tmp_path)
    with pytest.raises(
        errors.WorkdirError, match=r"was written by tfjax 0\.2\.0 or earlier"
    ) as raised:
        trainer.train_and_evaluate(longer, tmp_path)
    assert "\n" not in str(raised.value) and "checkpoints" in str(raised.value)
    assert workdir_format.saved_steps(tmp_path) == before and before[-1] == 4  # none written


def test_a_config_json_from_before_new_options_is_refused_in_one_line(tmp_path):
    tree = workdir_format.config_dict(_config("configs/base.py:tiny"))
    del tree["model"]["final_dropout"], tree["data"]["scan_split"]
    del tree["train"]["final_eval_examples"]
    test_workdir_format.write_older(tmp_path / "config.json", tree)
    test_workdir_format.assert_refused(tmp_path / "config.json")


def test_a_config_json_of_another_format_is_written_over_only_without_checkpoints(tmp_path, caplog):
    tree = workdir_format.config_dict(_config("configs/base.py:tiny"))
    test_workdir_format.write_older(tmp_path / "config.json", tree)
    with caplog.at_level(logging.WARNING, logger="tfjax.runs.workdir_format"):
        workdir_format.check_config_json(tmp_path)  # nothing depends on it: a warning
    assert "is of another workdir format and no checkpoint needs it" in caplog.text
    (tmp_path / "checkpoints" / "2").mkdir(parents=True)
    with pytest.raises(errors.WorkdirError, match=r"written by tfjax 0\.2\.0 or earlier"):
        workdir_format.check_config_json(tmp_path)


def test_the_final_eval_scores_final_eval_examples(tmp_path, monkeypatch):
    calls = []
    real = evaluator.evaluate

    def counted(run, params, *, max_examples=0, **kwargs):
        calls.append(max_examples)
        return real(run, params, max_examples=max_examples, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", counted)
    drops = []  # metrics.jsonl is read again only where a final_eval record may be replaced
    real_drop = logger.MetricWriter.drop

    def drop(writer, step, kind):
        drops.append((step, kind))
        return real_drop(writer, step, kind)

    monkeypatch.setattr(logger.MetricWriter, "drop", drop)
    overrides = ("train.eval_every_steps=0", "train.final_eval_examples=3")
    trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE, *overrides), tmp_path)
    assert calls == [3] and drops == []
    # Rerunning the finished run scores it again (here more examples) and replaces the record:
    # metrics.jsonl keeps one record per step and kind.
    again = (*overrides[:1], "train.final_eval_examples=40")
    result = trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE, *again), tmp_path)
    assert calls == [3, 40] and drops == [(2, "final_eval")]
    records = logger.read_metrics(tmp_path, "final_eval")
    assert [r["step"] for r in records] == [2]
    assert records[0]["loss"] == pytest.approx(result["loss"], rel=1e-6)


class _NoCheckpoint:
    def latest_step(self):
        return None


def test_a_step_window_that_scored_no_token_is_named_by_the_runs_kind():
    sums = {"weight_sum": 0.0, "loss_sum": 0.0, "grad_norm": 0.0}
    with pytest.raises(errors.DivergedError) as info:
        trainer._check_finite(sums, 4, _NoCheckpoint())
    message = str(info.value)
    assert message.startswith("no token was scored in the steps up to step 4") and (
        "check that the training examples have targets" in message
    )
    assert "masked-LM" not in message
    with pytest.raises(errors.DivergedError, match="A masked-LM run scores only tokens"):
        trainer._check_finite(sums, 4, _NoCheckpoint(), masked_lm=True)


def test_a_locked_workdir_is_refused_in_one_line_before_anything_is_written(tmp_path):
    with lock.WorkdirLock(tmp_path):  # another open file of the lock conflicts like a process
        with pytest.raises(errors.WorkdirLockedError) as info:
            trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE), tmp_path)
    message = str(info.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in message and "\n" not in message
    assert [p.name for p in tmp_path.iterdir()] == [lock.LOCK_FILE]


def test_the_lock_of_a_dead_run_is_taken_over(tmp_path, caplog):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is free now
    record = {"host": socket.gethostname(), "pid": child.pid, "started": "earlier"}
    (tmp_path / lock.LOCK_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        result = trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE), tmp_path)
    assert np.isfinite(result["loss"]) and f"pid {child.pid}" in caplog.text
    assert lock.read_holder(tmp_path) is None


def test_the_lock_is_released_after_an_exception_in_training(tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("a bug in the data pipeline")

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE), tmp_path)
    assert lock.read_holder(tmp_path) is None
    with lock.WorkdirLock(tmp_path):  # free again
        pass


def test_a_bad_config_value_fails_before_the_workdir_is_created(tmp_path):
    config = _config("configs/base.py:tiny", "train.log_every_steps=0")
    with pytest.raises(errors.ConfigError, match=r"train\.log_every_steps must be"):
        trainer.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("keep me")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(errors.WorkdirError, match="is a file, not a directory"):
            trainer.train_and_evaluate(_config("configs/base.py:tiny", *REVERSE), path)
    assert (tmp_path / "file").read_text() == "keep me"
