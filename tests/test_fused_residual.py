"""Tests for tfjax.nn.fused: the post-LN step LayerNorm(x + dropout(y)) as one Pallas kernel.

References: (1) the formula written out in numpy (float64) with the mask from `keep_mask`;
(2) `fused.reference`, the same step in jax.numpy, for gradients; (3) models with
residual_impl="pallas" against the default XLA path (same parameters, same values and
gradients without dropout). Off a GPU the kernels run in Pallas's interpreter; the CUDA test
lowers them to Triton without a GPU, and the GPU tests run them where one exists.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import errors, models
from tfjax.nn import fused, layers, norms

ON_GPU = jax.default_backend() == "gpu"


def _inputs(shape, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    d = shape[-1]
    x = jax.random.normal(k[0], shape, dtype)
    y = jax.random.normal(k[1], shape, dtype)
    scale = 1.0 + 0.2 * jax.random.normal(k[2], (d,))
    bias = 0.2 * jax.random.normal(k[3], (d,))
    return x, y, scale, bias, fused.make_seeds(k[4])


def _formula(x, y, scale, bias, keep, rate, eps=1e-6):
    """LayerNorm(x + y * keep / (1 - rate)) in float64 numpy."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.asarray(keep).reshape(x.shape)
    z = x + np.where(keep, y / (1.0 - rate), 0.0)
    mean = z.mean(-1, keepdims=True)
    var = ((z - mean) ** 2).mean(-1, keepdims=True)
    return (z - mean) / np.sqrt(var + eps) * np.asarray(scale) + np.asarray(bias)


@pytest.mark.parametrize("rate", [0.0, 0.3])
@pytest.mark.parametrize("shape", [(2, 8, 32), (3, 5, 16)])  # 15 rows: a padded last block
def test_forward_matches_the_formula(shape, rate):
    x, y, scale, bias, seeds = _inputs(shape)
    out = fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=rate, block_rows=4)
    keep = fused.keep_mask(seeds, (x.size // shape[-1], shape[-1]), rate)
    np.testing.assert_allclose(out, _formula(x, y, scale, bias, keep, rate), atol=2e-5)


@pytest.mark.parametrize("rate", [0.0, 0.25])
@pytest.mark.parametrize("block_rows", [1, 4, 16])
@pytest.mark.parametrize("shape", [(2, 6, 32), (3, 5, 32)])  # 15 rows: padded backward blocks
def test_gradients_match_the_reference(rate, block_rows, shape):
    x, y, scale, bias, seeds = _inputs(shape)
    weights = jnp.sin(jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape))

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a) * weights)

    def kernel(x, y, s, b):
        return fused.dropout_add_layer_norm(x, y, s, b, seeds, rate=rate, block_rows=block_rows)

    def ref(x, y, s, b):
        return fused.reference(x, y, s, b, seeds, rate=rate)

    got = jax.grad(loss(kernel), argnums=(0, 1, 2, 3))(x, y, scale, bias)
    want = jax.grad(loss(ref), argnums=(0, 1, 2, 3))(x, y, scale, bias)
    for name, g, w in zip(("x", "y", "scale", "bias"), got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=name)
    if rate:  # the dropped elements of y get no gradient; every kept one does
        keep = np.asarray(fused.keep_mask(seeds, (x.size // 32, 32), rate)).reshape(x.shape)
        assert np.all(np.asarray(got[1])[~keep] == 0)
        assert np.all(np.asarray(got[1])[keep] != 0)


def test_without_dropout_equals_the_xla_layer_norm():
    x, y, scale, bias, _ = _inputs((2, 4, 16))
    out = fused.dropout_add_layer_norm(x, y, scale, bias, rate=0.0)
    np.testing.assert_allclose(out, norms.layer_norm(x + y, scale, bias), atol=2e-6)


def test_bfloat16_matches_the_reference():
    x, y, scale, bias, seeds = _inputs((4, 16, 64), jnp.bfloat16)
    out = fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=0.1)
    want = fused.reference(x, y, scale, bias, seeds, rate=0.1)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(want, np.float32), atol=3e-2, rtol=2e-2
    )  # a bf16 ulp is 2^-7 relative: the rounding of z may differ by one


def test_keep_mask_is_a_fair_independent_coin():
    seeds = fused.make_seeds(jax.random.key(3))
    rate = 0.1
    keep = np.asarray(fused.keep_mask(seeds, (512, 256), rate))
    n = keep.size
    assert abs(keep.mean() - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / n)
    # neighbours along rows and columns, and the next row's same column, are independent
    for a, b in ((keep[:, 1:], keep[:, :-1]), (keep[1:], keep[:-1])):
        both_dropped = np.mean(~a & ~b)
        assert abs(both_dropped - rate**2) < 4 * np.sqrt(rate**2 / a.size)
    # another seed: agreement is that of two independent masks, p^2 + (1 - p)^2
    other = np.asarray(fused.keep_mask(fused.make_seeds(jax.random.key(4)), (512, 256), rate))
    agree = np.mean(keep == other)
    assert abs(agree - (rate**2 + (1 - rate) ** 2)) < 0.01


def test_bad_inputs_say_what_is_wrong():
    x, y, scale, bias, seeds = _inputs((2, 4, 16))
    with pytest.raises(ValueError, match="x and y must match"):
        fused.dropout_add_layer_norm(x, y[:, :2], scale, bias, seeds, rate=0.1)
    with pytest.raises(ValueError, match="must be \\(16,\\)"):
        fused.dropout_add_layer_norm(x, y, scale[:8], bias, seeds, rate=0.1)
    with pytest.raises(ValueError, match="seeds are required"):
        fused.dropout_add_layer_norm(x, y, scale, bias, rate=0.1)
    with pytest.raises(ValueError, match="Python float in \\[0, 1\\)"):
        fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=jnp.float32(0.1))
    with pytest.raises(ValueError, match="Python float in \\[0, 1\\)"):
        fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=1.0)
    with pytest.raises(ValueError, match="power of two"):
        fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=0.1, block_rows=3)


def test_kernels_lower_to_triton_for_cuda(monkeypatch):
    """Lowering (not compiling) for CUDA runs Pallas's Triton lowering of both kernels, so an
    operation Triton cannot express fails here, without a GPU."""
    monkeypatch.setattr(fused, "INTERPRET", False)
    x, y, scale, bias, seeds = (
        jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _inputs((2, 16, 256), jnp.bfloat16)
    )

    def loss(x, y, s, b, seeds):
        out = fused.dropout_add_layer_norm(x, y, s, b, seeds, rate=0.1)
        return jnp.sum(out.astype(jnp.float32))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    text = grad.trace(x, y, scale, bias, seeds).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 2  # forward and backward kernels
    assert "dropout_add_layer_norm_fwd" in text and "dropout_add_layer_norm_bwd" in text


def test_triton_needs_a_power_of_two_width(monkeypatch):
    monkeypatch.setattr(fused, "INTERPRET", False)
    x, y, scale, bias, seeds = _inputs((2, 4, 24))
    with pytest.raises(ValueError, match="power-of-two width, got D=24"):
        fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=0.1)


_TINY = dict(
    vocab_size=40,
    embed_dim=32,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=4,
    mlp_dim=64,
    max_len=16,
    dropout_rate=0.1,
)


def _batch():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.integers(3, 40, (2, 7))), jnp.asarray(rng.integers(3, 40, (2, 6)))


@pytest.mark.slow  # Pallas's interpreter through a model; the kernel's own tests stay default
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_models_match_the_xla_path_without_dropout(kind):
    xla = models.create_model(models.ModelConfig(kind=kind, **_TINY))
    pallas = models.create_model(models.ModelConfig(kind=kind, residual_impl="pallas", **_TINY))
    inputs, targets = _batch()
    args = (inputs, targets) if kind == "encoder_decoder" else (targets,)
    params = xla.init(jax.random.key(0), *args)["params"]
    assert jax.tree.structure(params) == jax.tree.structure(
        pallas.init(jax.random.key(0), *args)["params"]
    )

    def loss(model):
        return lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, *args)))

    with jax.default_matmul_precision("float32"):  # GPUs: no TF32 rounding of the matmuls
        got_logits = pallas.apply({"params": params}, *args)
        want_logits = xla.apply({"params": params}, *args)
        got, want = jax.grad(loss(pallas))(params), jax.grad(loss(xla))(params)
    np.testing.assert_allclose(got_logits, want_logits, atol=2e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=5e-5), got, want)


@pytest.mark.slow  # through a model, like the test above; the kernel's dropout tests stay default
def test_model_dropout_is_applied_and_reproducible():
    model = models.create_model(models.ModelConfig(residual_impl="pallas", **_TINY))
    inputs, targets = _batch()
    params = model.init(jax.random.key(0), inputs, targets)["params"]

    def train(seed):
        rngs = {"dropout": jax.random.key(seed)}
        return model.apply({"params": params}, inputs, targets, deterministic=False, rngs=rngs)

    evaluated = model.apply({"params": params}, inputs, targets)
    program = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, inputs, targets))(params))
    assert program.count("pallas_call") == 2 * 1 + 3 * 1  # each residual step runs the kernel
    np.testing.assert_array_equal(train(1), train(1))
    assert not np.allclose(train(1), train(2))
    assert not np.allclose(train(1), evaluated)


@pytest.mark.parametrize(
    ("fields", "named"),
    [(dict(norm_position="pre"), "norm_position='pre'"), (dict(norm="rmsnorm"), "norm='rmsnorm'")],
)
def test_config_refuses_what_the_kernel_does_not_fuse(fields, named):
    with pytest.raises(errors.ConfigError, match=named):
        models.ModelConfig(residual_impl="pallas", **fields)


@pytest.mark.skipif(not ON_GPU, reason="the Triton kernels run on NVIDIA GPUs")
@pytest.mark.parametrize("d", [512, 1024])
def test_triton_kernels_on_the_gpu_match_the_reference(d):
    x, y, scale, bias, seeds = _inputs((4, 128, d), jnp.bfloat16)
    weights = jnp.cos(jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) / 7)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * weights)

    def kernel(x, y, s, b):
        return fused.dropout_add_layer_norm(x, y, s, b, seeds, rate=0.1)

    def ref(x, y, s, b):
        return fused.reference(x, y, s, b, seeds, rate=0.1)

    np.testing.assert_allclose(
        np.asarray(jax.jit(kernel)(x, y, scale, bias), np.float32),
        np.asarray(jax.jit(ref)(x, y, scale, bias), np.float32),
        atol=3e-2,
        rtol=2e-2,  # z's bf16 rounding may differ by an ulp (2^-7 relative)
    )
    got = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2, 3)))(x, y, scale, bias)
    want = jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2, 3)))(x, y, scale, bias)
    for name, g, w in zip(("x", "y", "scale", "bias"), got, want, strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        np.testing.assert_allclose(
            g, w, atol=3e-2 * max(1.0, np.abs(w).max()), rtol=2e-2, err_msg=name
        )


def test_residual_module_refuses_what_the_kernel_cannot_run():
    x = jnp.ones((1, 3, 16))
    pre = layers.Residual("pre", implementation="pallas")
    with pytest.raises(ValueError, match="post-LN LayerNorm step only"):
        pre.init(jax.random.key(0), x, lambda h: h)
    traced = layers.Residual("post", dropout_rate=jnp.float32(0.1), implementation="pallas")
    params = layers.Residual("post", implementation="pallas").init(
        jax.random.key(0), x, lambda h: h
    )
    with pytest.raises(ValueError, match="vectorised sweeps"):
        traced.apply(
            params, x, lambda h: h, deterministic=False, rngs={"dropout": jax.random.key(1)}
        )
