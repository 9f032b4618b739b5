"""μP (`model.parametrization="mup"`, tfjax/models/mup.py, tfjax/training/mup.py): at
base_width it is today's model, step for step; wider, the multipliers land on the parameters
Tensor Programs V names."""

import jax
import numpy as np
import pytest
from mup_runs import config, replace, train

from tfjax import errors
from tfjax.models import mup as model_mup
from tfjax.runs import validation
from tfjax.training import mup, optim


def _same_training(cfg):
    standard = train(cfg, 3)
    at_base = train(replace(cfg, parametrization="mup", base_width=cfg.embed_dim), 3)
    assert standard[0] == at_base[0]  # the losses, bit for bit
    jax.tree.map(np.testing.assert_array_equal, standard[2].params, at_base[2].params)


def test_mup_at_base_width_trains_exactly_like_the_standard_model():
    _same_training(config(kind="decoder_only"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "encoder_decoder"},
        {"kind": "encoder_decoder", "tie_output": False, "share_embeddings": False},
        {"kind": "encoder_only"},
        {"kind": "decoder_only", "positional": "rotary", "score": "dot"},
    ],
)
def test_mup_at_base_width_trains_exactly_like_the_standard_model_every_kind(fields):
    _same_training(config(**fields))


def _multipliers(cfg, optimizer="adam"):
    params = validation.abstract_params(cfg)
    fn = mup.lr_multipliers(cfg, optimizer)
    flat = jax.tree_util.tree_flatten_with_path(fn(params) if fn else params)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in flat}


def test_the_multipliers_land_on_the_hidden_matrices_only():
    """At 4× the base width: Adam's LR / 4 on every attention and feed-forward kernel, 1 on
    embeddings, biases, norms; readout input / 4, queries / 2 (logits / 4 · 2 = 1/H)."""
    cfg = config(
        kind="decoder_only", embed_dim=64, mlp_dim=128, parametrization="mup", base_width=16
    )
    got = _multipliers(cfg)
    hidden = {k for k, v in got.items() if v != 1.0}
    assert hidden == {
        "decoder/layer_0/self_attention/qkv/kernel",
        "decoder/layer_0/self_attention/out/kernel",
        "decoder/layer_0/mlp/wi/kernel",
        "decoder/layer_0/mlp/wo/kernel",
    }, sorted(got)
    assert {got[k] for k in hidden} == {0.25}
    assert got["embed/embedding"] == 1.0
    assert model_mup.readout_multiplier(cfg) == 0.25
    assert model_mup.query_multiplier(cfg) == 0.5
    assert model_mup.embed_base_features(cfg) == 16
    assert mup.lr_multipliers(cfg, "muon") is None  # Muon's update is width-independent
    assert mup.lr_multipliers(replace(cfg, parametrization="standard")) is None


def test_the_encoder_only_heads_pooler_and_mlm_dense_are_hidden_matrices():
    cfg = config(kind="encoder_only", embed_dim=32, parametrization="mup", base_width=16)
    assert _multipliers(cfg)["pooler/kernel"] == 0.5
    assert _multipliers(cfg)["classifier/kernel"] == 1.0  # the readout: its input is scaled
    mlm = replace(cfg, encoder_head="mlm")
    assert _multipliers(mlm)["mlm_dense/kernel"] == 0.5


def test_the_multipliers_scale_adams_update_per_leaf():
    """make_optimizer with the multipliers: each leaf's update is Adam's times its multiplier."""
    params = {"mlp": {"wi": {"kernel": np.ones((2, 3), np.float32)}}, "b": np.ones(3, np.float32)}
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    config_ = optim.OptimConfig(schedule="constant", learning_rate=0.1, warmup_steps=0)
    plain, _ = optim.make_optimizer(config_, 8)
    scaled, _ = optim.make_optimizer(
        config_, 8, lambda p: {"mlp": {"wi": {"kernel": 0.25}}, "b": 1.0}
    )
    u0, _ = plain.update(grads, plain.init(params), params)
    u1, _ = scaled.update(grads, scaled.init(params), params)
    np.testing.assert_allclose(u1["mlp"]["wi"]["kernel"], 0.25 * u0["mlp"]["wi"]["kernel"])
    np.testing.assert_array_equal(u1["b"], u0["b"])


@pytest.mark.parametrize(
    "fields, mentions",
    [
        ({"parametrization": "mup"}, "base_width"),
        ({"parametrization": "mup", "base_width": 8, "score": "additive"}, "score"),
        ({"parametrization": "mu"}, "parametrization"),
    ],
)
def test_mup_config_checks(fields, mentions):
    with pytest.raises(errors.ConfigError, match=mentions):
        config(**fields)


@pytest.mark.slow  # ~4 s on a quiet CPU: two programs and a vmapped one
def test_vectorised_trials_apply_the_multipliers():
    """Two μP trials (LRs 1e-2 and 3e-2) at 2x the base width in one vmapped step each end
    where `make_optimizer` with the multipliers takes them alone, and not where it takes them
    without (the hidden matrices' updates halved)."""
    from mup_runs import batch

    from tfjax import models
    from tfjax.training import steps, vectorized

    cfg = config(
        kind="decoder_only", embed_dim=32, mlp_dim=64, parametrization="mup", base_width=16
    )
    # No biases: the key projection's gets gradients of pure rounding noise (softmax ignores
    # it), which Adam scales up differently in the two programs.
    cfg = replace(cfg, use_bias=False)
    model, data = models.create_model(cfg), batch("decoder_only")
    configs = [
        optim.OptimConfig(schedule="constant", learning_rate=lr, warmup_steps=0)
        for lr in (1e-2, 3e-2)
    ]
    rng = jax.random.key(1)
    init = steps.create_train_state(
        model, optim.make_optimizer(configs[0], 32)[0], rng, data, "decoder_only"
    )

    def alone(trial, multipliers):
        optimizer, schedule = optim.make_optimizer(trial, 32, multipliers)
        state = init.replace(opt_state=optimizer.init(init.params))
        step = steps.make_train_step(
            model, optimizer, schedule, kind="decoder_only", label_smoothing=0.0
        )
        return jax.jit(step)(state, data, rng)[0].params

    structure = optim.traced_structure(configs)
    hyper = jax.tree.map(
        lambda *x: jax.numpy.stack(x), *[optim.traced_hyper(c, structure) for c in configs]
    )
    vstep = vectorized.make_vectorized_train_step(
        model, structure, d_model=32, kind="decoder_only", label_smoothing=0.0, shared_batch=True
    )
    traced, _ = optim.traced_optimizer(
        vectorized.unstack(hyper, 0), structure, 32, mup.lr_multipliers(cfg)
    )
    start = init.replace(opt_state=traced.init(init.params))
    state = vectorized.SweepState(train=vectorized.stack([start, start]), live=np.ones(2, bool))
    new, _ = jax.jit(vstep)(state, data, jax.numpy.stack([rng, rng]), hyper)
    for i, trial in enumerate(configs):
        got = vectorized.unstack(new.train.params, i)
        want = alone(trial, mup.lr_multipliers(cfg))
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), got, want)
    plain = alone(configs[0], None)["decoder"]["layer_0"]["mlp"]["wi"]["kernel"]
    got = vectorized.unstack(new.train.params, 0)["decoder"]["layer_0"]["mlp"]["wi"]["kernel"]
    assert np.abs(np.asarray(got) - np.asarray(plain)).max() > 1e-3
