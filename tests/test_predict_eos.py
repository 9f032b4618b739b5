"""Training without EOS (`train.predict_eos=False`, Newman et al. 2020's "-EOS" models).

The steps leave every target position that holds EOS out of the loss and the scores
(`steps.unscore_target_id`); the references below are the cross-entropy written out over the
other positions, and literal matrices for the exact match.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_workdir_format
from tiny_runs import REVERSE

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import tokenizers
from tfjax.nn import losses
from tfjax.runs import build, evaluator, restoration, trainer, validation, workdir_format
from tfjax.training import steps

EOS = tokenizers.EOS_ID
TINY = dict(
    vocab_size=23,
    embed_dim=16,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    mlp_dim=32,
    max_len=16,
    dropout_rate=0.0,
)
# Two packed target rows: segments end with EOS (2); padding is segment 0.
_ROWS = {
    "inputs": np.array([[5, 6, 7, 2, 0], [8, 9, 2, 10, 2]], np.int32),
    "inputs_segment_ids": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 2, 2]], np.int32),
    "inputs_positions": np.array([[0, 1, 2, 3, 0], [0, 1, 2, 0, 1]], np.int32),
    "targets": np.array([[11, 12, 13, 2, 0, 0], [14, 2, 15, 16, 17, 2]], np.int32),
    "targets_segment_ids": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 2, 2, 2, 2]], np.int32),
    "targets_positions": np.array([[0, 1, 2, 3, 0, 0], [0, 1, 0, 1, 2, 3]], np.int32),
}
BATCH = {key: jnp.asarray(value) for key, value in _ROWS.items()}
SCORED = (_ROWS["targets_segment_ids"] > 0) & (_ROWS["targets"] != EOS)  # 7 positions


def _model_and_params(kind: str):
    model = models.create_model(models.ModelConfig(**TINY, kind=kind))
    args, kwargs = steps.model_inputs(jax.tree.map(jnp.asarray, BATCH), kind)
    return model, model.init(jax.random.key(0), *args, **kwargs)["params"]


def _logits(model, params, kind):
    args, kwargs = steps.model_inputs(jax.tree.map(jnp.asarray, BATCH), kind)
    return model.apply({"params": params}, *args, **kwargs, deterministic=True)


def _reference_nll(logits):
    """Σ -log p(target) over the scored positions, written out."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, jnp.asarray(BATCH["targets"])[..., None], -1)[..., 0]
    return -jnp.sum(picked * SCORED)


def test_sequence_exact_match_skips_positions_of_weight_zero():
    predictions = jnp.array([[4, 5, 9, 0], [6, 7, 8, 3]], jnp.int32)
    targets = jnp.array([[4, 5, 2, 0], [6, 1, 8, 2]], jnp.int32)
    segment_ids = jnp.array([[1, 1, 1, 0], [1, 1, 2, 2]], jnp.int32)
    # unweighted: every one of the 3 sequences has a wrong token
    assert tuple(map(float, losses.sequence_exact_match(predictions, targets, segment_ids))) == (
        0.0,
        3.0,
    )
    weights = (targets != 2).astype(jnp.int32)  # the EOS positions are not scored
    correct, count = losses.sequence_exact_match(predictions, targets, segment_ids, weights)
    # row 0: right once its EOS is unscored; row 1 segment 1: 7 != 1; segment 2: right
    assert (float(correct), float(count)) == (2.0, 3.0)
    # Bypass the test-only jaxtyping check (which would also reject this) to reach the ValueError.
    unchecked = getattr(losses.sequence_exact_match, "__wrapped__", losses.sequence_exact_match)
    with pytest.raises(ValueError, match=r"weights: expected shape \(2, 4\), got \(2, 3\)"):
        unchecked(predictions, targets, segment_ids, weights[:, :3])


def test_unscoring_a_target_id_keeps_the_zero_weights_already_there():
    batch = {
        "targets": jnp.array([[1, 5, 2, 7], [2, 6, 6, 2]], jnp.int32),
        "targets_weights": jnp.array([[0, 1, 1, 1], [1, 1, 0, 1]], jnp.int32),
    }
    weights = steps.unscore_target_id(batch, EOS)["targets_weights"]
    np.testing.assert_array_equal(weights, [[0, 1, 0, 1], [0, 1, 0, 0]])
    fresh = steps.unscore_target_id({"targets": batch["targets"]}, EOS)["targets_weights"]
    np.testing.assert_array_equal(fresh, [[1, 1, 0, 1], [0, 1, 1, 0]])


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_eval_step_without_eos_scores_the_other_positions_only(kind):
    model, params = _model_and_params(kind)
    logits = _logits(model, params, kind)
    plain = steps.make_eval_step(model, kind=kind, label_smoothing=0.0)(params, BATCH)
    without = steps.make_eval_step(model, kind=kind, label_smoothing=0.0, unscored_id=EOS)(
        params, BATCH
    )
    assert float(without["weight_sum"]) == SCORED.sum() == 7
    assert float(plain["weight_sum"]) == 10
    np.testing.assert_allclose(without["nll_sum"], _reference_nll(logits), rtol=1e-5)
    predictions = np.asarray(jnp.argmax(logits, -1))
    assert float(without["correct_sum"]) == ((predictions == _ROWS["targets"]) & SCORED).sum()


@pytest.mark.slow  # the default tier: the eval step's tests, the config's train step below
def test_train_step_without_eos_follows_the_gradient_of_the_other_positions():
    kind = "encoder_decoder"
    model, params = _model_and_params(kind)
    optimizer = optax.sgd(1.0)
    train_step = steps.make_train_step(
        model, optimizer, optax.constant_schedule(1.0), kind=kind, label_smoothing=0.0,
        unscored_id=EOS,
    )  # fmt: skip
    state = steps.TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    new_state, metrics = train_step(state, BATCH, jax.random.key(1))
    grads = jax.grad(lambda p: _reference_nll(_logits(model, p, kind)) / SCORED.sum())(params)
    expected = jax.tree.map(lambda p, g: p - g, params, grads)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        new_state.params,
        expected,
    )
    assert float(metrics["weight_sum"]) == 7


@pytest.mark.parametrize(
    "predict_eos",
    [pytest.param(True, marks=pytest.mark.slow), False],  # True: the usual step
)
def test_the_configs_train_step_scores_eos_as_train_predict_eos_says(predict_eos):
    config = config_utils.load_config(
        "configs/base.py:tiny", [*REVERSE, f"train.predict_eos={predict_eos}"]
    )
    model, params = _model_and_params("encoder_decoder")
    optimizer = optax.sgd(0.0)
    state = steps.TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    train_step = build.make_train_step(config, model, optimizer, optax.constant_schedule(0.0))
    _, metrics = train_step(state, BATCH, jax.random.key(0))
    assert float(metrics["weight_sum"]) == (10 if predict_eos else 7)


def test_unscored_targets_are_refused_for_an_encoder_only_model():
    model = models.create_model(models.ModelConfig(**TINY, kind="encoder_only"))
    with pytest.raises(ValueError, match="encoder_only"):
        steps.make_eval_step(model, kind="encoder_only", label_smoothing=0.0, unscored_id=EOS)


def test_an_encoder_only_run_without_eos_is_a_one_line_config_error():
    overrides = ["train.predict_eos=false", "model.kind=encoder_only"]
    config = config_utils.load_config("configs/base.py:tiny", overrides)
    with pytest.raises(errors.ConfigError, match="for models that generate") as info:
        validation.check_config(config)
    assert "\n" not in str(info.value)
    with pytest.raises(errors.ConfigError, match="write true or false"):
        config_utils.load_config("configs/base.py:tiny", ["train.predict_eos=maybe"])


@pytest.mark.slow
def test_a_run_without_eos_trains_evaluates_with_the_oracle_and_warns_without(tmp_path, caplog):
    config = config_utils.load_config("configs/base.py:tiny", [*REVERSE, "train.predict_eos=false"])
    trainer.train_and_evaluate(config, tmp_path)
    run = build.build(config, tmp_path)
    batch = {
        k: jnp.asarray(np.stack([e[k] for e in run.examples.train[:4]]))
        for k in run.examples.train[0]
    }
    assert (batch["targets"] == EOS).sum() >= 4  # EOS is in the data, not in the loss:
    assert run.eval_step is not None
    params = restoration.restore(config, tmp_path)[1].state.params
    metrics = run.eval_step(params, batch)
    unscored = (batch["targets_segment_ids"] > 0) & (batch["targets"] != EOS)
    assert float(metrics["weight_sum"]) == unscored.sum()

    with caplog.at_level(logging.WARNING, logger="tfjax.runs.evaluator"):
        plain = evaluator.evaluate_workdir(tmp_path, beam_size=1)
    assert "trained without EOS" in caplog.text and "--oracle_length" in caplog.text
    assert plain["predict_eos"] is False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfjax.runs.evaluator"):
        oracle = evaluator.evaluate_workdir(tmp_path, beam_size=1, oracle_length=True)
    assert "trained without EOS" not in caplog.text
    assert oracle["oracle_length"] is True and oracle["predict_eos"] is False


def test_runs_saved_before_predict_eos_are_refused_in_one_line(tmp_path):
    config = config_utils.load_config("configs/base.py:tiny", REVERSE)
    tree = workdir_format.config_dict(config)
    del tree["train"]["predict_eos"]
    test_workdir_format.write_older(tmp_path / "config.json", tree)
    test_workdir_format.assert_refused(tmp_path / "config.json")
