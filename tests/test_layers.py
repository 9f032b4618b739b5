"""tfjax.nn.layers: norms, feed-forward, embeddings and residual sub-layers vs formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.nn import layers, losses, norms

X = jax.random.normal(jax.random.key(0), (2, 3, 8)) * 3.0 + 1.0


def test_layer_norm_matches_formula():
    scale = jnp.linspace(0.5, 2.0, 8)
    bias = jnp.linspace(-1.0, 1.0, 8)
    out = norms.layer_norm(X, scale, bias, eps=1e-6)
    x = np.asarray(X, np.float64)[1, 2]
    mean = sum(x) / 8
    var = sum((xi - mean) ** 2 for xi in x) / 8
    expected = [
        float(scale[i]) * (x[i] - mean) / math.sqrt(var + 1e-6) + float(bias[i]) for i in range(8)
    ]
    np.testing.assert_allclose(out[1, 2], expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_matches_formula_and_modules_own_params():
    scale = jnp.linspace(0.5, 2.0, 8)
    x = np.asarray(X, np.float64)[0, 1]
    rms = math.sqrt(sum(xi * xi for xi in x) / 8 + 1e-6)
    np.testing.assert_allclose(
        norms.rms_norm(X, scale)[0, 1], x / rms * np.asarray(scale), rtol=1e-5
    )
    ln = norms.LayerNorm().init(jax.random.key(0), X)["params"]
    assert set(ln) == {"scale", "bias"}
    rms_params = norms.RMSNorm().init(jax.random.key(0), X)["params"]
    assert set(rms_params) == {"scale"}
    with pytest.raises(ValueError, match="norm"):
        norms.make_norm("batchnorm", epsilon=1e-6, dtype=jnp.float32, param_dtype=jnp.float32)


def test_norm_in_bfloat16_computes_statistics_in_float32():
    big = (X + 1000.0).astype(jnp.bfloat16)
    out = norms.LayerNorm(dtype=jnp.bfloat16).apply(
        {"params": {"scale": jnp.ones(8), "bias": jnp.zeros(8)}}, big
    )
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32).mean(-1), 0.0, atol=0.05)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("activation", layers.ACTIVATIONS)
def test_feed_forward_matches_formula(activation):
    module = layers.FeedForward(mlp_dim=16, activation=activation)
    params = module.init(jax.random.key(1), X)["params"]
    out = module.apply({"params": params}, X)
    x = np.asarray(X, np.float64)
    hidden = x @ np.asarray(params["wi"]["kernel"]) + np.asarray(params["wi"]["bias"])
    if activation == "relu":
        hidden = np.maximum(hidden, 0.0)
    elif activation == "gelu":
        erf = np.vectorize(math.erf)
        hidden = 0.5 * hidden * (1.0 + erf(hidden / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        hidden = _gelu_tanh(hidden)
    elif activation == "silu":
        hidden = hidden / (1.0 + np.exp(-hidden))
    else:
        gate = x @ np.asarray(params["wi_gate"]["kernel"]) + np.asarray(params["wi_gate"]["bias"])
        gate = gate / (1.0 + np.exp(-gate)) if activation == "swiglu" else _gelu_tanh(gate)
        hidden = gate * hidden
    expected = hidden @ np.asarray(params["wo"]["kernel"]) + np.asarray(params["wo"]["bias"])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_feed_forward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation"):
        layers.FeedForward(mlp_dim=4, activation="tanh").init(jax.random.key(0), X)


def test_embed_scales_by_sqrt_dim_and_ties_logits():
    module = layers.Embed(vocab_size=11, features=8)
    tokens = jnp.array([[1, 5, 10]])
    variables = module.init(jax.random.key(0), tokens)
    table = np.asarray(variables["params"]["embedding"])
    np.testing.assert_allclose(
        module.apply(variables, tokens)[0, 1], table[5] * math.sqrt(8), rtol=1e-6
    )
    logits = module.apply(variables, X, method=module.attend)
    np.testing.assert_allclose(logits, np.asarray(X) @ table.T, rtol=1e-5, atol=1e-5)


def _plain_loss(monkeypatch):
    """Replaces the loss's custom derivative by plain autodiff."""

    def token_losses(logits, targets, weights, confidence, low):
        log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
        smoothed = (confidence - low) * nll - low * jnp.sum(log_p, axis=-1)
        return jnp.sum(smoothed * weights), jnp.sum(nll * weights)

    monkeypatch.setattr(losses, "_weighted_token_losses", token_losses)


@pytest.mark.parametrize(
    "kind", [pytest.param("encoder_decoder", marks=pytest.mark.slow), "decoder_only"]
)
def test_forward_mode_and_hvp_through_a_whole_model_equal_plain_autodiff(kind, monkeypatch):
    # jax.jvp and a Hessian-vector product of the training loss in the parameters, through
    # the whole model and the loss's custom derivative, against the same model with the loss
    # written for plain autodiff.
    cfg = models.ModelConfig(
        kind=kind,
        vocab_size=11,
        embed_dim=8,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        mlp_dim=16,
        dropout_rate=0.0,
    )
    model = models.create_model(cfg)
    tokens = jnp.array([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]], jnp.int32)
    segments = (tokens > 0).astype(jnp.int32)
    args = (tokens, tokens) if kind == "encoder_decoder" else (tokens,)
    params = model.init(jax.random.key(0), *args)["params"]
    direction = jax.tree.map(
        lambda p: jnp.sin(jnp.arange(p.size, dtype=p.dtype)).reshape(p.shape), params
    )

    def loss(params):
        logits = model.apply({"params": params}, *args)
        return losses.compute_metrics(logits, tokens, segments, label_smoothing=0.1)["loss_sum"]

    def derivatives():
        jvp = jax.jvp(loss, (params,), (direction,))
        return jvp, jax.jvp(jax.grad(loss), (params,), (direction,))[1]

    # One program per side (a new function each, so the second is traced again after the patch):
    # op by op, the Hessian-vector product of a whole model takes several times longer.
    ours = jax.jit(lambda: derivatives())()
    _plain_loss(monkeypatch)
    plain = jax.jit(lambda: derivatives())()
    np.testing.assert_allclose(ours[0], plain[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(plain[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("position", ["post", "pre"])
def test_residual_post_and_pre_ln(position):
    module = layers.Residual(norm_position=position, dropout_rate=0.0)
    fn = lambda h: 2.0 * h + 1.0  # noqa: E731
    variables = module.init(jax.random.key(0), X, fn)
    out = module.apply(variables, X, fn)
    ones, zeros = jnp.ones(8), jnp.zeros(8)
    if position == "post":
        expected = norms.layer_norm(X + fn(X), ones, zeros)
    else:
        expected = X + fn(norms.layer_norm(X, ones, zeros))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_residual_dropout_only_when_not_deterministic():
    module = layers.Residual(norm_position="pre", dropout_rate=0.5)
    fn = lambda h: h  # noqa: E731
    variables = module.init(jax.random.key(0), X, fn)
    det = module.apply(variables, X, fn, deterministic=True)
    noisy = module.apply(variables, X, fn, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(det, noisy)
    with pytest.raises(ValueError, match="norm_position"):
        layers.Residual(norm_position="middle").init(jax.random.key(0), X, fn)
