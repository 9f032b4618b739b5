"""Tests for tfjax.nn.attention.chunked: the blocked online softmax against the reference path.

References: (1) `dot_product_attention(..., implementation="reference")` with the dense mask and
bias, values and gradients (q, k, v, a dense bias, score weights, a learned T5 table); (2) the
formula written out in numpy (`_formula`); (3) models with attention_impl="chunked" against the
default; (4) XLA's compiled temporary memory of the backward pass, linear in L.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.nn import attention, masking, positional
from tfjax.nn.attention import chunked

B, N, H = 2, 4, 4
SLOW = pytest.mark.slow


def _qkv(length, kv_length=None, num_kv=N, seed=0, dtype=jnp.float32, head_dim=H):
    kv_length = length if kv_length is None else kv_length
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(k1, (B, length, N, head_dim), dtype)
    k = jax.random.normal(k2, (B, kv_length, num_kv, head_dim), dtype)
    v = jax.random.normal(k3, (B, kv_length, num_kv, head_dim), dtype)
    return q, k, v


def _formula(q, k, v, mask, bias):
    """softmax(q k^T / sqrt(H) + bias) v over the allowed keys, float64 numpy; empty rows 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)  # [B, S, N, H]
    logits = np.einsum("blnh,bsnh->bnls", q, k) / np.sqrt(q.shape[-1]) + np.asarray(bias)
    allowed = np.broadcast_to(np.asarray(mask), logits.shape)
    logits = np.where(allowed, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    weights = np.where(allowed, np.exp(logits - np.where(np.isfinite(top), top, 0)), 0)
    total = weights.sum(-1, keepdims=True)
    weights = weights / np.where(total > 0, total, 1)
    return np.einsum("bnls,bsnh->blnh", weights, v)


def _loss(fn):
    """A scalar of the output that weights every entry differently (sin of a ramp)."""
    return lambda *args: jnp.sum(jnp.sin(fn(*args) * jnp.arange(1, H + 1)))


def _value_and_grads(fn, args):
    """fn(*args) and the gradients of `_loss(fn)` w.r.t. every arg, in one compiled program."""
    argnums = tuple(range(len(args)))
    return jax.jit(lambda *a: (fn(*a), jax.grad(_loss(fn), argnums)(*a)))(*args)


def _assert_values_and_grads(chunk_fn, ref_fn, args, atol=1e-5):
    """chunk_fn(*args) equals ref_fn(*args), and so do their gradients w.r.t. every arg;
    returns chunk_fn(*args)."""
    out, got = _value_and_grads(chunk_fn, args)
    want_out, want = _value_and_grads(ref_fn, args)
    np.testing.assert_allclose(out, want_out, atol=atol)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, atol=atol * 10)
    return out


def _dense_masks(length, kv_length):
    """Dense masks of every kind by name, broadcastable to [B, N, L, S]."""
    keep = jax.random.bernoulli(jax.random.key(3), 0.6, (B, N, length, kv_length))
    lengths = jnp.array([kv_length, kv_length - 3])
    return {
        "none": None,
        "causal": masking.causal_mask(length, kv_length),
        "padding": (masking.lengths_to_segment_ids(lengths, kv_length) != 0)[:, None, None, :],
        "random_per_head": keep.at[0, 1, 2].set(False),  # one row sees no key
    }


@pytest.mark.parametrize(
    "mask_kind, length, kv_length, num_kv, chunks",
    [
        # Chunks that do not divide the lengths, grouped-query heads, a row that sees no key.
        ("random_per_head", 13, 13, 2, (4, 5)),
        pytest.param("causal", 9, 14, 2, (3, 4), marks=SLOW),  # cross shapes
        pytest.param("padding", 13, 13, N, (4, 5), marks=SLOW),
        pytest.param("none", 8, 8, 1, (8, 8), marks=SLOW),  # one block, MQA
        pytest.param("causal", 6, 11, 2, (16, 32), marks=SLOW),  # chunks > length
        pytest.param("random_per_head", 9, 14, 1, (3, 4), marks=SLOW),
    ],
)
def test_values_and_gradients_equal_the_reference_path(
    mask_kind, length, kv_length, num_kv, chunks
):
    q, k, v = _qkv(length, kv_length, num_kv)
    mask = _dense_masks(length, kv_length)[mask_kind]
    bias = 0.5 * jax.random.normal(jax.random.key(4), (1, N, length, kv_length))
    query_chunk, key_chunk = chunks
    chunk_fn = lambda q, k, v, bias: chunked.chunked_attention(  # noqa: E731
        q, k, v, mask=mask, bias=bias, query_chunk=query_chunk, key_chunk=key_chunk
    )
    ref_fn = lambda q, k, v, bias: attention.dot_product_attention(  # noqa: E731
        q, k, v, mask=mask, bias=bias, implementation="reference"
    )
    out = _assert_values_and_grads(chunk_fn, ref_fn, (q, k, v, bias))
    full_mask = True if mask is None else mask
    np.testing.assert_allclose(out, _formula(q, k, v, full_mask, bias), atol=1e-5)


def test_dot_product_attention_dispatches_and_fully_masked_rows_are_zero_with_finite_grads():
    q, k, v = _qkv(12)
    mask = jnp.ones((B, 1, 12, 12), bool).at[:, :, 3:5].set(False)  # rows 3, 4 see nothing
    out, grads = _value_and_grads(
        lambda q, k, v: attention.dot_product_attention(
            q, k, v, mask=mask, implementation="chunked"
        ),
        (q, k, v),
    )
    ref = attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")
    np.testing.assert_allclose(out, ref, atol=1e-5)
    np.testing.assert_array_equal(out[:, 3:5], 0.0)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    np.testing.assert_array_equal(grads[0][:, 3:5], 0.0)


def _packed(length):
    """[B, L] segment ids (row 0: segments 1 and 2, then two pads; row 1: one segment, one pad)
    and positions restarting at 0 in each segment (0 on padding)."""
    split, index = length // 3, jnp.arange(length)
    row0 = [1] * split + [2] * (length - 2 - split) + [0, 0]
    segment_ids = jnp.array([row0, [1] * (length - 1) + [0]], jnp.int32)
    positions = jnp.stack([index - jnp.where(index >= split, split, 0), index])
    return segment_ids, jnp.where(segment_ids > 0, positions, 0).astype(jnp.int32)


def _relative_bias(table, relative):
    return positional.relative_offset_bias(relative, table, num_buckets=8, max_distance=10)


@pytest.mark.parametrize(
    "length, causal, radius, packed, bias_kind, chunks",
    [
        (13, True, None, True, "relative", (4, 3)),  # packed decoder, learned T5 table
        (15, True, 4, False, "alibi", (4, 6)),  # causal window, bias of index offsets
        pytest.param(13, True, None, False, None, (4, 5), marks=SLOW),
        pytest.param(11, False, None, True, "alibi", (5, 4), marks=SLOW),
        pytest.param(15, True, 4, True, "alibi", (4, 6), marks=SLOW),
        pytest.param(12, False, 3, False, "relative", (4, 4), marks=SLOW),
        pytest.param(10, False, None, False, "relative", (3, 7), marks=SLOW),
    ],
)
def test_structural_masks_and_offset_biases_equal_their_dense_versions(
    length, causal, radius, packed, bias_kind, chunks
):
    """Causality, a radius, segment ids and offset biases built per block equal the dense
    mask and bias; gradients include the learned T5 table's."""
    q, k, v = _qkv(length, num_kv=2)
    segment_ids, positions = _packed(length) if packed else (None, None)
    dense_positions = positions if packed else jnp.arange(length)[None]
    window = attention.Window(radius, causal, segment_ids, positions)
    mask, _ = attention.local.dense_mask_and_bias(window, length)
    table = jax.random.normal(jax.random.key(9), (8, N))
    slopes = positional.alibi_slopes(N)
    offset_fns = {
        "relative": lambda table: functools.partial(_relative_bias, table),
        "alibi": lambda table: functools.partial(positional.alibi_offset_bias, slopes=slopes),
        None: lambda table: None,
    }

    def chunk_fn(q, k, v, table):
        return chunked.chunked_attention(
            q,
            k,
            v,
            causal=causal,
            radius=radius,
            segment_ids=segment_ids,
            positions=positions,
            offset_bias=offset_fns[bias_kind](table),
            query_chunk=chunks[0],
            key_chunk=chunks[1],
        )

    def ref_fn(q, k, v, table):
        offset_bias = offset_fns[bias_kind](table)
        bias = None
        if offset_bias is not None:
            relative = dense_positions[:, None, :] - dense_positions[:, :, None]  # [B|1, L, S]
            bias = jnp.moveaxis(offset_bias(relative), -1, 1)  # [B|1, N, L, S]
        return attention.dot_product_attention(
            q, k, v, mask=mask, bias=bias, implementation="reference"
        )

    _assert_values_and_grads(chunk_fn, ref_fn, (q, k, v, table))


@pytest.mark.parametrize(
    "score",
    [
        "additive",
        "general",
        pytest.param("dot", marks=SLOW),
        pytest.param("scaled_dot", marks=SLOW),
    ],
)
def test_every_score_equals_the_reference_with_gradients_of_its_weights(score):
    q, k, v = _qkv(8, num_kv=2)
    keys = jax.random.split(jax.random.key(5), 3)
    params = {
        "general": {"w": jnp.eye(H) + 0.3 * jax.random.normal(keys[0], (N, H, H))},
        "additive": {
            "w_q": jax.random.normal(keys[0], (N, H, H)),
            "w_k": jax.random.normal(keys[1], (N, H, H)),
            "v": jax.random.normal(keys[2], (N, H)),
        },
    }.get(score, {})
    mask = masking.causal_mask(8)

    def chunk_fn(q, k, v, params):
        return chunked.chunked_attention(
            q, k, v, causal=True, score=score, score_params=params, query_chunk=4, key_chunk=3
        )

    def ref_fn(q, k, v, params):
        return attention.dot_product_attention(
            q, k, v, mask=mask, score=score, score_params=params, implementation="reference"
        )

    _assert_values_and_grads(chunk_fn, ref_fn, (q, k, v, params))


def _dropout_out(rng, rate=0.3, length=64, **kwargs):
    """Chunked attention with uniform probabilities (q = 0) over one-hot values, so that
    out[b, i, n, j] = keep_ij / (1 - rate) / S: the dropout mask, read back."""
    q = jnp.zeros((B, length, N, length))
    k = jax.random.normal(jax.random.key(1), (B, length, N, length))
    v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (B, length, N, length))
    return chunked.chunked_attention(
        q, k, v, dropout_rate=rate, dropout_rng=rng, deterministic=False,
        query_chunk=16, key_chunk=24, **kwargs,
    )  # fmt: skip


def test_dropout_keeps_1_minus_rate_rescales_and_is_seeded():
    rate, length = 0.3, 64
    draw = jax.jit(lambda rng: _dropout_out(rng, rate, length))
    out = draw(jax.random.key(0))
    kept = np.asarray(out) > 0  # [B, L, N, S]: 32768 Bernoulli draws
    assert abs(kept.mean() - (1 - rate)) < 0.015, kept.mean()
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / (1 - rate) / length, rtol=1e-5)
    # Blocks draw different masks: no two of the 4 x 2 full [16, 24] blocks of row 0, head 0
    # repeat.
    blocks = kept[0, :, 0].reshape(4, 16, 64)[:, :, :48].reshape(4, 16, 2, 24)
    flat = [blocks[i, :, j].tobytes() for i in range(4) for j in range(2)]
    assert len(set(flat)) == len(flat)
    np.testing.assert_array_equal(out, draw(jax.random.key(0)))
    assert not np.array_equal(out, draw(jax.random.key(1)))
    deterministic = chunked.chunked_attention(
        *_qkv(8), dropout_rate=0.5, dropout_rng=jax.random.key(0), deterministic=True
    )
    np.testing.assert_allclose(deterministic, chunked.chunked_attention(*_qkv(8)), atol=0)
    with pytest.raises(ValueError, match="dropout_rng"):
        chunked.chunked_attention(*_qkv(8), dropout_rate=0.5, deterministic=False)


def test_dropout_backward_pass_redraws_the_forward_masks():
    """out = A v is linear in v, and the gradient must be A^T (the same dropped probabilities
    the forward pass used, redrawn in the rematerialised backward pass)."""
    rng, rate, length = jax.random.key(2), 0.4, 20
    q, k, _ = _qkv(length, head_dim=length)
    kwargs = dict(
        dropout_rate=rate, dropout_rng=rng, deterministic=False, query_chunk=8, key_chunk=6
    )
    eye = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (B, length, N, length))
    w = jax.random.normal(jax.random.key(3), (B, length, N, length))
    v = jax.random.normal(jax.random.key(4), (B, length, N, length))
    attend = functools.partial(chunked.chunked_attention, q, k, causal=True, **kwargs)
    a, grad_v = jax.jit(lambda: (attend(eye), jax.grad(lambda v: jnp.sum(w * attend(v)))(v)))()
    # a: [B, L, N, S] = A
    np.testing.assert_allclose(grad_v, jnp.einsum("blns,blnh->bsnh", a, w), atol=1e-5)
    assert float(jnp.mean(a[a > 0] > 0)) == 1.0 and float(jnp.mean(a == 0)) > 0.3


def test_bfloat16_inputs_accumulate_in_float32():
    q, k, v = _qkv(24, num_kv=2)
    mask = masking.causal_mask(24)
    low = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))

    def chunk_fn(q, k, v):
        out = chunked.chunked_attention(q, k, v, causal=True, query_chunk=8, key_chunk=5)
        assert out.dtype == q.dtype
        return out.astype(jnp.float32)

    def ref_fn(q, k, v):
        out = attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")
        return out.astype(jnp.float32)

    out, grads = _value_and_grads(chunk_fn, low)
    want, want_grads = _value_and_grads(ref_fn, (q, k, v))
    np.testing.assert_allclose(out, want, atol=3e-2)
    err_chunked = float(jnp.abs(out - want).max())
    err_reference = float(jnp.abs(ref_fn(*low) - want).max())
    assert err_chunked <= 2 * err_reference + 1e-3  # no worse than the reference in bf16
    for g, w in zip(grads, want_grads, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(jnp.float32), w, atol=0.1, rtol=0.05)


def test_jit_equals_eager_and_bad_inputs_raise():
    q, k, v = _qkv(9)
    fn = functools.partial(chunked.chunked_attention, causal=True, query_chunk=4, key_chunk=4)
    np.testing.assert_allclose(jax.jit(fn)(q, k, v), fn(q, k, v), atol=1e-6)
    q2, k2, v2 = _qkv(9, 7)
    with pytest.raises(ValueError, match="self-attention"):
        chunked.chunked_attention(q2, k2, v2, segment_ids=jnp.ones((B, 9), jnp.int32))
    with pytest.raises(ValueError, match="score"):
        chunked.chunked_attention(q, k, v, score="cosine")


def _model_batch(kind):
    """(positional args, keyword args) of one packed batch (sources of 9, targets of 8)."""
    batch = {}
    for name, length, seed in (("inputs", 9, 1), ("targets", 8, 2)):
        segment_ids, positions = _packed(length)
        tokens = jax.random.randint(jax.random.key(seed), segment_ids.shape, 3, 31)
        batch[name] = jnp.where(segment_ids > 0, tokens, 0)
        batch[f"{name}_segment_ids"], batch[f"{name}_positions"] = segment_ids, positions
    names = {"encoder_decoder": ("inputs", "targets"), "encoder_only": ("inputs",)}
    names = names.get(kind, ("targets",))
    kwargs = {key: x for key, x in batch.items() if key.split("_")[0] in names and "_" in key}
    return tuple(batch[name] for name in names), kwargs


@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("decoder_only", dict(positional="relative", num_layers=1)),
        pytest.param("decoder_only", dict(positional="alibi", scan_layers=True), marks=SLOW),
        pytest.param("encoder_only", dict(encoder_head="mlm", score="general"), marks=SLOW),
        pytest.param("encoder_decoder", dict(positional="rotary", window_radius=2), marks=SLOW),
    ],
)
def test_models_with_chunked_attention_equal_the_default_with_gradients(kind, overrides):
    """Forward and backward of a packed batch; the chunked model builds no [L, L] mask."""
    sizes = dict(vocab_size=31, embed_dim=16, num_layers=2, num_decoder_layers=2, num_heads=4)
    cfg = dict(sizes, num_kv_heads=2, mlp_dim=32, dropout_rate=0.0, kind=kind, **overrides)
    model = models.create_model(models.ModelConfig(**cfg))
    chunked_model = models.create_model(models.ModelConfig(**cfg, attention_impl="chunked"))
    args, kwargs = _model_batch(kind)
    variables = model.init(jax.random.key(0), *args, **kwargs)

    def loss(model, params):
        return jnp.sum(jnp.sin(model.apply({"params": params}, *args, **kwargs)))

    np.testing.assert_allclose(
        loss(chunked_model, variables["params"]), loss(model, variables["params"]), rtol=1e-5
    )
    got = jax.jit(jax.grad(functools.partial(loss, chunked_model)))(variables["params"])
    want = jax.jit(jax.grad(functools.partial(loss, model)))(variables["params"])
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = functools.reduce(lambda t, key: t[key.key], path, want)
        np.testing.assert_allclose(g, w, atol=2e-5, err_msg=jax.tree_util.keystr(path))


def _grad_temp_bytes(impl, length, **kwargs):
    """XLA's temporary bytes of a compiled forward + backward of causal attention over [1, L]."""
    q = jax.ShapeDtypeStruct((1, length, 2, 16), jnp.float32)
    mask = None if impl == "chunked" else masking.causal_mask(length)

    def loss(q, k, v):
        if impl == "chunked":
            out = chunked.chunked_attention(q, k, v, causal=True, **kwargs)
        else:
            out = attention.dot_product_attention(q, k, v, mask=mask, implementation=impl)
        return jnp.sum(out**2)

    compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, q, q).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_backward_pass_memory_grows_linearly_with_length():
    chunks = dict(query_chunk=64, key_chunk=64)
    small, large = (_grad_temp_bytes("chunked", n, **chunks) for n in (512, 2048))
    dense_small, dense_large = (_grad_temp_bytes("reference", n) for n in (512, 2048))
    assert large / small < 4.5, (small, large)  # 4x the length: at most ~4x the memory
    assert dense_large / dense_small > 12, (dense_small, dense_large)  # ~16x: [L, S]
    assert large < dense_small  # 2048 chunked under 512 dense


def test_a_window_without_radius_is_its_dense_mask_off_the_chunked_path():
    q, k, v = _qkv(10)
    segment_ids, _ = _packed(10)
    window = attention.Window(None, causal=True, segment_ids=segment_ids)
    mask = masking.causal_mask(10) & masking.segment_mask(segment_ids)
    want = attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")
    for implementation in ("auto", "chunked"):
        got = attention.window_attention(q, k, v, window, implementation=implementation)
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert models.ModelConfig(attention_impl="chunked").attention_impl == "chunked"
