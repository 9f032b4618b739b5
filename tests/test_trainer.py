"""End-to-end tests of train_and_evaluate: checkpoints, exact resume, NaN stop, config checks."""

import json
import pathlib

import jax
import numpy as np
import optax
import pytest

from experiments import config_utils
from tfjax.data import pipeline
from tfjax.runs import build, trainer
from tfjax.training import logger, optim


def _config(spec="configs/base.py:tiny", *overrides):
    return config_utils.load_config(spec, list(overrides))


def _restore(workdir: pathlib.Path, step=None):
    config = build.load_config_json(workdir / "config.json")
    return build.restore(config, workdir, step)[1]


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
    assert {"train", "eval", "final_eval"} <= kinds
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert _restore(tmp_path).step == 4


def test_resume_after_a_crash_between_saves_is_bit_exact(tmp_path, monkeypatch):
    # Reference: 8 uninterrupted steps.
    trainer.train_and_evaluate(
        _config("configs/base.py:tiny", "train.num_train_steps=8"), tmp_path / "straight"
    )
    # Same run, crashing after step 6 (checkpoint at 4): the rerun restores step 4 and replays.
    config = _config("configs/base.py:tiny", "train.num_train_steps=8")
    original_next = pipeline.BatchIterator.__next__
    calls = {"n": 0}

    def crash_after_six(self):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt("simulated kill")
        return original_next(self)

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", crash_after_six)
    with pytest.raises(KeyboardInterrupt):
        trainer.train_and_evaluate(config, tmp_path / "crashed")
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", original_next)
    assert _restore(tmp_path / "crashed").step == 4
    trainer.train_and_evaluate(config, tmp_path / "crashed")

    straight, resumed = _params(tmp_path / "straight"), _params(tmp_path / "crashed")
    jax.tree.map(np.testing.assert_array_equal, straight, resumed)
    last = [logger.read_metrics(tmp_path / run, "train")[-1] for run in ("straight", "crashed")]
    assert last[0]["loss"] == last[1]["loss"] and last[0]["step"] == last[1]["step"] == 8


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = optim.make_optimizer

    def poisoned(config, d_model):
        optimizer, schedule = real(config, d_model)

        def update(updates, state, params=None):
            updates, inner = optimizer.update(updates, state[0], params)
            poison = jnp_nan_if(state[1] == 4)  # the 5th update makes every parameter NaN
            return jax.tree.map(lambda u: u + poison, updates), (inner, state[1] + 1)

        def init(params):
            return optimizer.init(params), jax.numpy.zeros((), jax.numpy.int32)

        return optax.GradientTransformation(init, update), schedule

    def jnp_nan_if(condition):
        return jax.numpy.where(condition, jax.numpy.nan, 0.0)

    monkeypatch.setattr(optim, "make_optimizer", poisoned)
    config = _config("configs/base.py:tiny", "train.num_train_steps=12", "train.eval_every_steps=0")
    with pytest.raises(FloatingPointError, match="last good checkpoint is step 4"):
        trainer.train_and_evaluate(config, tmp_path)
    assert _restore(tmp_path).step == 4
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(tmp_path)))


def test_a_workdir_from_another_model_is_refused_and_kept(tmp_path):
    trainer.train_and_evaluate(_config("configs/base.py:tiny", "train.num_train_steps=4"), tmp_path)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    other = _config("configs/base.py:tiny", "model.embed_dim=64", "train.num_train_steps=8")
    with pytest.raises(ValueError, match="embed_dim"):
        trainer.train_and_evaluate(other, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert _restore(tmp_path).step == 4
