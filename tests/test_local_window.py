"""Models with `window_radius` r > 0: the blocked O(L · r) self-attention of `attention.local`.

References: (1) the same model with the blocked computation swapped for a dense masked one written
here (`_dense_local_attention`); (2) the model without a window, where the radius covers the
whole length; (3) the receptive field, r per layer; (4) XLA's compiled temporary memory, linear
in L with the window and quadratic without.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.nn import attention, masking

TINY = dict(
    vocab_size=31,
    embed_dim=16,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    num_kv_heads=2,
    mlp_dim=32,
    max_len=32,
    dropout_rate=0.0,
)
KINDS = ("encoder_decoder", "encoder_only", "decoder_only")
# Packed rows: source [2, 9] and target [2, 8], two segments and padding in row 0.
SRC_SEG = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1]], jnp.int32)
TGT_SEG = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1, 0]], jnp.int32)


def _positions(segment_ids):
    """Positions restarting at 0 in each segment (0 on padding)."""
    seg = np.asarray(segment_ids)
    new = np.diff(seg, axis=1, prepend=-1) != 0
    starts = np.maximum.accumulate(np.where(new, np.arange(seg.shape[1]), 0), axis=1)
    return jnp.asarray(np.where(seg > 0, np.arange(seg.shape[1]) - starts, 0), jnp.int32)


def _tokens(segment_ids, seed):
    tokens = jax.random.randint(jax.random.key(seed), segment_ids.shape, 3, 31)
    return jnp.where(segment_ids > 0, tokens, 0)


def _call_args(kind, packed=True):
    """(positional args, keyword args) of one packed batch for a model of `kind`."""
    src, tgt = _tokens(SRC_SEG, 1), _tokens(TGT_SEG, 2)
    src_kw = dict(inputs_segment_ids=SRC_SEG, inputs_positions=_positions(SRC_SEG))
    tgt_kw = dict(targets_segment_ids=TGT_SEG, targets_positions=_positions(TGT_SEG))
    if kind == "encoder_decoder":
        return (src, tgt), ({**src_kw, **tgt_kw} if packed else {})
    if kind == "encoder_only":
        return (src,), (src_kw if packed else {})
    return (tgt,), (tgt_kw if packed else {})


def _model(kind, **overrides):
    cfg = models.ModelConfig(**{**TINY, "kind": kind, "encoder_head": "mlm", **overrides})
    model = models.create_model(cfg)
    args, kwargs = _call_args(kind)
    return model, model.init(jax.random.key(0), *args, **kwargs)


def _dense_local_attention(
    q, k, v, *, radius, causal, segment_ids, positions, offset_bias, score, **dropout
):
    """`local_attention`'s contract computed densely: window mask AND segment mask, [L, L]
    bias from the offsets of the positions, `dot_product_attention` on the reference path."""
    length = q.shape[1]
    mask = masking.window_mask(length, radius, causal=causal)
    if segment_ids is not None:
        mask = mask & masking.segment_mask(segment_ids)
    bias = None
    if offset_bias is not None:
        if positions is None:
            positions = jnp.arange(length)[None]
        bias = offset_bias(positions[:, None, :] - positions[:, :, None])  # [B, L, S, N]
        bias = jnp.moveaxis(bias, -1, 1)  # [B, N, L, S]
    return attention.dot_product_attention(
        q, k, v, mask=mask, bias=bias, score=score, implementation="reference", **dropout
    )


POSITIONALS = ("sinusoidal", "relative", "alibi", "rotary")


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("kind", KINDS)
def test_blocked_model_equals_the_dense_masked_model(kind, positional, monkeypatch):
    model, variables = _model(kind, window_radius=2, positional=positional)
    args, kwargs = _call_args(kind)
    blocked = model.apply(variables, *args, **kwargs)
    calls = []

    def dense(*a, **kw):
        calls.append(kw["radius"])
        return _dense_local_attention(*a, **kw)

    monkeypatch.setattr(attention.local, "local_attention", dense)
    expected = model.apply(variables, *args, **kwargs)
    layers = TINY["num_layers"] + (TINY["num_decoder_layers"] if kind == "encoder_decoder" else 0)
    assert calls == [2] * layers  # every self-attention layer took the blocked path
    np.testing.assert_allclose(blocked, expected, atol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "relative", "alibi"])
@pytest.mark.parametrize("kind", KINDS)
def test_window_covering_the_rows_equals_no_window(kind, positional):
    # Radius 8 covers rows of 9 (encoder) and 8 (decoder) tokens, in two blocks of 8 positions:
    # the blocked path must give the dense model's logits, packing and biases included.
    model, variables = _model(kind, positional=positional)
    windowed, windowed_variables = _model(kind, positional=positional, window_radius=8)
    shapes = jax.tree.map(jnp.shape, variables)
    assert jax.tree.map(jnp.shape, windowed_variables) == shapes  # checkpoints still load
    args, kwargs = _call_args(kind)
    np.testing.assert_allclose(
        windowed.apply(variables, *args, **kwargs),
        model.apply(variables, *args, **kwargs),
        atol=1e-5,
    )


@pytest.mark.parametrize("positional", ["relative", "alibi"])
@pytest.mark.parametrize("kind", KINDS)
def test_window_bias_reads_the_given_positions(kind, positional):
    # Positions with gaps (3 * index, shifted per row) are not the indices up to a constant, so
    # a window whose bias read the indices instead would differ from the dense model.
    model, variables = _model(kind, positional=positional)
    windowed, _ = _model(kind, positional=positional, window_radius=8)
    args, _ = _call_args(kind, packed=False)
    names = {"encoder_decoder": ("inputs", "targets"), "encoder_only": ("inputs",)}
    kwargs = {
        f"{name}_positions": 3 * jnp.arange(tokens.shape[1]) + jnp.array([[0], [1]])
        for name, tokens in zip(names.get(kind, ("targets",)), args, strict=True)
    }
    np.testing.assert_allclose(
        windowed.apply(variables, *args, **kwargs),
        model.apply(variables, *args, **kwargs),
        atol=1e-5,
    )
    assert not np.allclose(
        windowed.apply(variables, *args), model.apply(variables, *args, **kwargs)
    )


def _changed_outputs(apply, tokens, query, radius_reach):
    """Which of the tokens at query ± radius_reach and one step further change output `query`."""
    out = apply(tokens)
    result = {}
    for j in (
        query - radius_reach - 1,
        query - radius_reach,
        query + radius_reach,
        query + radius_reach + 1,
    ):
        other = apply(tokens.at[:, j].set(tokens[:, j] % 28 + 3))
        result[j - query] = not np.allclose(other[:, query], out[:, query], atol=1e-6)
    return result


@pytest.mark.parametrize("score", ["scaled_dot", "general"])
@pytest.mark.parametrize("kind", ["encoder_only", "encoder_decoder"])
def test_encoder_receptive_field_is_radius_times_layers(kind, score):
    radius, length, query = 2, 16, 7
    reach = radius * TINY["num_layers"]
    model, variables = _model(kind, window_radius=radius, score=score)
    tokens = _tokens(jnp.ones((1, length), jnp.int32), 3)
    if kind == "encoder_only":
        apply = lambda t: model.apply(variables, t)  # noqa: E731
    else:
        apply = lambda t: model.apply(variables, t, method=model.encode)  # noqa: E731
    changed = _changed_outputs(apply, tokens, query, reach)
    assert changed == {-reach - 1: False, -reach: True, reach: True, reach + 1: False}


@pytest.mark.parametrize("positional", ["sinusoidal", "relative"])
def test_decoder_only_receptive_field_is_causal_and_radius_times_layers(positional):
    radius, length, query = 2, 20, 10
    reach = radius * TINY["num_layers"]
    model, variables = _model("decoder_only", window_radius=radius, positional=positional)
    targets = _tokens(jnp.ones((1, length), jnp.int32), 4)
    apply = lambda t: model.apply(variables, t)  # noqa: E731
    # Logits at t read decoder inputs t - reach .. t, i.e. targets t - reach - 1 .. t - 1.
    changed = _changed_outputs(apply, targets, query, reach + 1)
    assert changed == {-reach - 2: False, -reach - 1: True, reach + 1: False, reach + 2: False}
    changed = _changed_outputs(apply, targets, query, 0)
    assert changed == {-1: True, 0: False, 1: False}


def _temp_bytes(kind, length, radius):
    """XLA's temporary bytes for one compiled forward pass of a one-layer model over [1, L]."""
    cfg = models.ModelConfig(
        **{**TINY, "num_layers": 1, "max_len": length, "kind": kind, "encoder_head": "mlm"},
        window_radius=radius,
        positional="relative",
    )
    model = models.create_model(cfg)
    tokens = jnp.ones((1, length), jnp.int32)
    variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
    compiled = jax.jit(model.apply).lower(variables, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("kind", ["encoder_only", "decoder_only"])
def test_compiled_memory_grows_linearly_with_a_window(kind):
    windowed = _temp_bytes(kind, 1024, 4) / _temp_bytes(kind, 256, 4)
    dense = _temp_bytes(kind, 1024, 0) / _temp_bytes(kind, 256, 0)
    assert windowed < 6, windowed  # 4x the length: ~4x the memory
    assert dense > 10, dense  # ~16x: the [L, L] logits
