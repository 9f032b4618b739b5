"""Tests for tfjax.nn.attention against references written out here, jax.nn and Flax attention."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import attention, masking, positional

B, L, S, N, H = 2, 5, 6, 4, 4


def _qkv(seed=0, num_kv=N, length=L, kv_length=S, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(k1, (B, length, N, H), dtype)
    k = jax.random.normal(k2, (B, kv_length, num_kv, H), dtype)
    v = jax.random.normal(k3, (B, kv_length, num_kv, H), dtype)
    return q, k, v


def _reference(q, k, v, mask=None, bias=None, scale=True):
    """Per-head loops in numpy: softmax(q k^T / sqrt(H) + bias) v over the allowed keys."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, length, n, h = q.shape
    g = n // k.shape[2]
    out = np.zeros((b, length, n, v.shape[-1]))
    for bi in range(b):
        for ni in range(n):
            for li in range(length):
                logits = k[bi, :, ni // g] @ q[bi, li, ni]
                logits = logits / np.sqrt(h) if scale else logits
                if bias is not None:
                    logits = logits + np.broadcast_to(bias, (b, n, length, k.shape[1]))[bi, ni, li]
                allowed = np.ones(k.shape[1], bool)
                if mask is not None:
                    allowed = np.broadcast_to(mask, (b, n, length, k.shape[1]))[bi, ni, li]
                if not allowed.any():
                    continue
                weights = np.exp(logits[allowed] - logits[allowed].max())
                weights /= weights.sum()
                out[bi, li, ni] = weights @ v[bi, allowed, ni // g]
    return out


def _random_mask(seed=1):
    return jax.random.bernoulli(jax.random.key(seed), 0.7, (B, 1, L, S))


@pytest.mark.parametrize("implementation", ["reference", "auto"])
@pytest.mark.parametrize("num_kv", [N, 2, 1])
def test_matches_reference_with_mask_and_bias(implementation, num_kv):
    q, k, v = _qkv(num_kv=num_kv)
    mask = _random_mask()
    bias = jax.random.normal(jax.random.key(7), (1, N, L, S))
    out = attention.dot_product_attention(
        q, k, v, mask=mask, bias=bias, implementation=implementation
    )
    np.testing.assert_allclose(out, _reference(q, k, v, mask, bias), atol=1e-5)


def test_matches_jax_nn_dot_product_attention():
    q, k, v = _qkv(num_kv=2)
    mask = masking.causal_mask(L, S)
    expected = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    out = attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", "auto"])
def test_fully_masked_rows_are_zero_and_finite(implementation):
    q, k, v = _qkv()
    mask = np.ones((B, 1, L, S), bool)
    mask[0, 0, 2] = False  # query 2 of batch 0 sees nothing
    mask = jnp.asarray(mask)

    def f(q):
        return attention.dot_product_attention(q, k, v, mask=mask, implementation=implementation)

    out = f(q)
    np.testing.assert_array_equal(out[0, 2], 0.0)
    assert np.abs(np.asarray(out[1, 2])).sum() > 0
    grad = jax.grad(lambda q: f(q).sum())(q)
    assert np.isfinite(np.asarray(grad)).all()


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = _qkv(num_kv=2)
    g = N // 2
    grouped = attention.dot_product_attention(q, k, v, implementation="reference")
    repeated = attention.dot_product_attention(
        q, jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2), implementation="reference"
    )
    np.testing.assert_allclose(grouped, repeated, atol=1e-6)


def test_score_functions_against_formulas():
    q, k, _ = _qkv()
    scaled = attention.attention_logits(q, k, score="scaled_dot")
    dot = attention.attention_logits(q, k, score="dot")
    np.testing.assert_allclose(scaled * np.sqrt(H), dot, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dot[1, 3, 2, 4], np.dot(q[1, 2, 3], k[1, 4, 3]), rtol=1e-5)

    w = jax.random.normal(jax.random.key(3), (N, H, H))
    general = attention.attention_logits(q, k, score="general", score_params={"w": w})
    np.testing.assert_allclose(general[0, 1, 2, 3], q[0, 2, 1] @ w[1] @ k[0, 3, 1], rtol=1e-5)

    a = 3
    params = {
        "w_q": jax.random.normal(jax.random.key(4), (N, H, a)),
        "w_k": jax.random.normal(jax.random.key(5), (N, H, a)),
        "v": jax.random.normal(jax.random.key(6), (N, a)),
    }
    additive = attention.attention_logits(q, k, score="additive", score_params=params)
    b, n, i, j = 1, 2, 3, 4
    expected = params["v"][n] @ np.tanh(
        q[b, i, n] @ params["w_q"][n] + k[b, j, n] @ params["w_k"][n]
    )
    np.testing.assert_allclose(additive[b, n, i, j], expected, rtol=1e-5, atol=1e-6)


def test_unknown_score_and_bad_shapes_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="score"):
        attention.dot_product_attention(q, k, v, score="cosine")
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention.dot_product_attention(q, k[:, :, :3], v[:, :, :3])


def test_probability_dropout_is_seeded_and_off_when_deterministic():
    q, k, v = _qkv()
    kwargs = dict(dropout_rate=0.5, dropout_rng=jax.random.key(0))
    det = attention.dot_product_attention(q, k, v, deterministic=True, **kwargs)
    np.testing.assert_allclose(det, attention.dot_product_attention(q, k, v), atol=1e-6)
    a = attention.dot_product_attention(q, k, v, deterministic=False, **kwargs)
    b = attention.dot_product_attention(q, k, v, deterministic=False, **kwargs)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, det)


def _mha(**kwargs):
    return attention.MultiHeadAttention(num_heads=N, **kwargs)


def test_mha_matches_flax_multi_head_attention():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    mask = masking.padding_mask(jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    ours = _mha(fused_qkv=False)
    params = ours.init(jax.random.key(1), x)
    flax_mha = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=N * H)
    flax_params = flax_mha.init(jax.random.key(2), x, x)
    # Same tree structure and shapes: query/key/value [D, N, H], out [N, H, D].
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, flax_params)
    expected = flax_mha.apply(params, x, x, mask=mask)
    out = ours.apply(params, x, mask=mask)
    valid = np.asarray(mask[:, 0].any(-1))  # flax averages fully masked rows; we return zeros
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(expected)[valid], atol=1e-5)


def test_mha_equals_jax_nn_with_same_projections():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    module = _mha(num_kv_heads=2)
    params = module.init(jax.random.key(1), x)["params"]
    qkv = jnp.einsum("BLD,DMH->BLMH", x, params["qkv"]["kernel"]) + params["qkv"]["bias"]
    q, k, v = qkv[:, :, :N], qkv[:, :, N : N + 2], qkv[:, :, N + 2 :]
    mask = masking.causal_mask(L)
    heads = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    expected = jnp.einsum("BLNH,NHD->BLD", heads, params["out"]["kernel"]) + params["out"]["bias"]
    out = module.apply({"params": params}, x, mask=mask)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_mha_fused_equals_unfused_and_cross_attention_shapes():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    fused = _mha(num_kv_heads=2).init(jax.random.key(1), x)["params"]
    kernel, bias = fused["qkv"]["kernel"], fused["qkv"]["bias"]
    split = {
        "query": {"kernel": kernel[:, :N], "bias": bias[:N]},
        "key": {"kernel": kernel[:, N : N + 2], "bias": bias[N : N + 2]},
        "value": {"kernel": kernel[:, N + 2 :], "bias": bias[N + 2 :]},
        "out": fused["out"],
    }
    a = _mha(num_kv_heads=2).apply({"params": fused}, x)
    b = _mha(num_kv_heads=2, fused_qkv=False).apply({"params": split}, x)
    np.testing.assert_allclose(a, b, atol=1e-6)

    memory = jax.random.normal(jax.random.key(2), (B, S, 12))
    cross = _mha(num_kv_heads=2)
    variables = cross.init(jax.random.key(3), x, memory)
    assert variables["params"]["kv"]["kernel"].shape == (12, 4, H)
    assert cross.apply(variables, x, memory).shape == (B, L, N * H)


def test_mha_low_rank_values_and_scores_have_parameters():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    params = _mha(value_rank=3).init(jax.random.key(1), x)["params"]
    assert params["value_down"]["kernel"].shape == (N * H, 3)
    assert params["value_up"]["kernel"].shape == (3, N, H)
    assert params["qkv"]["kernel"].shape == (N * H, 2 * N, H)
    for score, name in [("general", "score_w"), ("additive", "score_v")]:
        module = _mha(score=score)
        variables = module.init(jax.random.key(1), x)
        assert name in variables["params"]
        assert np.isfinite(np.asarray(module.apply(variables, x))).all()


def test_low_rank_values_are_the_two_matmuls_written_out():
    # Self-attention over one key: the softmax is 1, so the output is out((x·W_down)·W_up + b).
    x = jax.random.normal(jax.random.key(0), (B, 1, N * H))
    module = _mha(value_rank=3)
    params = module.init(jax.random.key(1), x)["params"]
    params = jax.tree.map(lambda p: p + 0.1 * jnp.cos(jnp.arange(p.size)).reshape(p.shape), params)
    down, up, out = params["value_down"]["kernel"], params["value_up"], params["out"]
    v = np.einsum("bsd,dr->bsr", x, down)  # [B, 1, r]
    v = np.einsum("bsr,rnh->bsnh", v, up["kernel"]) + up["bias"]  # [B, 1, N, H]
    want = np.einsum("bsnh,nhd->bsd", v, out["kernel"]) + out["bias"]
    np.testing.assert_allclose(module.apply({"params": params}, x), want, rtol=1e-5, atol=1e-5)


def test_rotary_attention_is_invariant_to_a_global_position_shift():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    module = _mha(rotary=True)
    variables = module.init(jax.random.key(1), x)
    positions = jnp.broadcast_to(jnp.arange(L), (B, L))
    a = module.apply(variables, x, q_positions=positions)
    b = module.apply(variables, x, q_positions=positions + 11)
    np.testing.assert_allclose(a, b, atol=1e-4)
    c = module.apply(variables, x, q_positions=positions * 2)  # different offsets
    assert not np.allclose(a, c, atol=1e-3)


def test_mha_jit_equals_eager_and_bf16_keeps_float32_params():
    x = jax.random.normal(jax.random.key(0), (B, L, N * H))
    module = _mha(dtype=jnp.bfloat16)
    variables = module.init(jax.random.key(1), x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables))
    out = module.apply(variables, x)
    assert out.dtype == jnp.bfloat16
    jitted = jax.jit(module.apply)(variables, x)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(jitted, np.float32), atol=2e-2
    )
    f32 = _mha().apply(variables, x)
    np.testing.assert_allclose(np.asarray(out, np.float32), f32, atol=0.1)


def test_mha_rejects_bad_head_counts():
    x = jnp.zeros((B, L, 16))
    with pytest.raises(ValueError, match="num_kv_heads"):
        attention.MultiHeadAttention(num_heads=4, num_kv_heads=3).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        attention.MultiHeadAttention(num_heads=5).init(jax.random.key(0), x)


@pytest.mark.parametrize(
    "length, radius, causal, num_kv",
    [(13, 3, False, N), (13, 3, True, 2), (8, 1, False, 1), (5, 7, True, N)],
)
def test_local_attention_equals_dense_window_mask(length, radius, causal, num_kv):
    q, k, v = _qkv(num_kv=num_kv, length=length, kv_length=length)
    mask = masking.window_mask(length, radius, causal=causal)
    expected = attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")
    out = attention.local_attention(q, k, v, radius=radius, causal=causal)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    with pytest.raises(ValueError, match="radius"):
        attention.local_attention(q, k, v, radius=0)


def _packed(length):
    """[B, L] segment ids (row 0: two segments and padding; row 1: one segment, one pad) and
    positions restarting at 0 in each segment."""
    split = length // 3
    seg = np.zeros((B, length), np.int32)
    seg[0, :split], seg[0, split : length - 2] = 1, 2
    seg[1, : length - 1] = 1
    starts = np.maximum.accumulate(
        np.where(np.diff(seg, axis=1, prepend=-1) != 0, np.arange(length), 0), axis=1
    )
    positions = np.where(seg > 0, np.arange(length) - starts, 0)
    return jnp.asarray(seg), jnp.asarray(positions, jnp.int32)


def _offset_bias(kind):
    """(offset_bias function, dense bias function of [B, L] positions) for `kind`."""
    if kind == "alibi":
        slopes = positional.alibi_slopes(N)
        fn = functools.partial(positional.alibi_offset_bias, slopes=slopes)
        return fn, lambda pos: positional.alibi_bias(pos, pos, slopes)
    module = positional.RelativePositionBias(N, num_buckets=8, max_distance=10)
    variables = {"params": {"rel_embedding": jax.random.normal(jax.random.key(9), (8, N))}}
    fn = module.apply(variables, method=module.offset_bias)
    return fn, lambda pos: module.apply(variables, pos, pos)


@pytest.mark.parametrize(
    "length, radius, causal, num_kv, score, bias_kind",
    [
        (13, 3, False, N, "scaled_dot", None),
        (13, 3, True, 2, "dot", "alibi"),
        (10, 4, False, 1, "scaled_dot", "relative"),
        (7, 2, True, 1, "scaled_dot", "relative"),
        (11, 3, False, 2, "dot", "relative"),
        (9, 2, True, N, "dot", None),
        (6, 9, False, 2, "scaled_dot", "alibi"),  # radius > L: one block
    ],
)
def test_local_attention_with_segments_and_offset_bias_equals_dense(
    length, radius, causal, num_kv, score, bias_kind
):
    q, k, v = _qkv(num_kv=num_kv, length=length, kv_length=length)
    seg, positions = _packed(length)
    mask = masking.combine_masks(
        masking.window_mask(length, radius, causal=causal), masking.segment_mask(seg)
    )
    offset_bias, dense_bias = _offset_bias(bias_kind) if bias_kind else (None, None)
    bias = dense_bias(positions) if bias_kind else None
    expected = attention.dot_product_attention(
        q, k, v, mask=mask, bias=bias, score=score, implementation="reference"
    )
    out = attention.local_attention(
        q,
        k,
        v,
        radius=radius,
        causal=causal,
        segment_ids=seg,
        positions=positions,
        offset_bias=offset_bias,
        score=score,
    )
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_array_equal(out[0, -2:], 0.0)  # padding sees no key: zeros, as dense


@pytest.mark.parametrize("bias_kind", ["alibi", "relative"])
def test_local_attention_offset_bias_reads_positions_or_indices(bias_kind):
    length, radius = 11, 3
    q, k, v = _qkv(num_kv=2, length=length, kv_length=length)
    offset_bias, dense_bias = _offset_bias(bias_kind)
    mask = masking.window_mask(length, radius)
    indices = jnp.broadcast_to(jnp.arange(length), (B, length))
    strided = indices * jnp.array([[2], [3]])  # positions that are not the indices
    for positions, dense_positions in [(None, indices), (strided, strided)]:
        expected = attention.dot_product_attention(
            q, k, v, mask=mask, bias=dense_bias(dense_positions)
        )
        out = attention.local_attention(
            q, k, v, radius=radius, positions=positions, offset_bias=offset_bias
        )
        np.testing.assert_allclose(out, expected, atol=1e-5)


def test_local_attention_dropout_keeps_1_minus_rate_and_rescales():
    # q = 0: every visible key gets probability 1 / count; v = one-hot of the key index, so
    # the output reads each (query, key) probability after dropout.
    length, radius, rate = 48, 4, 0.25
    q = jnp.zeros((B, length, N, length))
    v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (B, length, 2, length))
    kwargs = dict(radius=radius, dropout_rate=rate, dropout_rng=jax.random.key(3))
    out = np.asarray(attention.local_attention(q, v, v, deterministic=False, **kwargs))
    visible = np.asarray(masking.window_mask(length, radius))[0, 0]  # [L, S]
    count = visible.sum(-1)[None, :, None, None]  # [1, L, 1, 1]
    probs = np.broadcast_to(visible[None, :, None, :] / count, out.shape)
    kept = out != 0
    assert not (kept & ~visible[None, :, None, :]).any()
    np.testing.assert_allclose(out[kept], probs[kept] / (1 - rate), rtol=1e-5)
    fraction = kept.sum() / np.broadcast_to(visible[None, :, None, :], out.shape).sum()
    assert abs(fraction - (1 - rate)) < 0.03, fraction
    again = attention.local_attention(q, v, v, deterministic=False, **kwargs)
    np.testing.assert_array_equal(out, again)
    deterministic = attention.local_attention(q, v, v, deterministic=True, **kwargs)
    np.testing.assert_allclose(deterministic, probs, atol=1e-6)


def test_local_attention_rejects_scores_with_parameters_and_bad_ids():
    q, k, v = _qkv(length=7, kv_length=7)
    with pytest.raises(ValueError, match="scores"):
        attention.local_attention(q, k, v, radius=2, score="general")
    with pytest.raises((ValueError, TypeError)):
        attention.local_attention(q, k, v, radius=2, segment_ids=jnp.ones((B, 6), jnp.int32))


@pytest.mark.parametrize("score", ["general", "additive"])
def test_window_attention_falls_back_to_the_dense_mask(score):
    length, radius = 9, 2
    q, k, v = _qkv(num_kv=2, length=length, kv_length=length)
    seg, positions = _packed(length)
    offset_bias, dense_bias = _offset_bias("alibi")
    keys = jax.random.split(jax.random.key(5), 3)
    params = {
        "general": {"w": jax.random.normal(keys[0], (N, H, H))},
        "additive": {
            "w_q": jax.random.normal(keys[1], (N, H, 3)),
            "w_k": jax.random.normal(keys[2], (N, H, 3)),
            "v": jnp.ones((N, 3)),
        },
    }[score]
    window = attention.local.Window(radius, True, seg, positions, offset_bias)
    mask = masking.combine_masks(
        masking.window_mask(length, radius, causal=True), masking.segment_mask(seg)
    )
    kwargs = dict(score=score, score_params=params)
    expected = attention.dot_product_attention(
        q, k, v, mask=mask, bias=dense_bias(positions), **kwargs
    )
    got = attention.local.window_attention(q, k, v, window, **kwargs)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not attention.local.blocked_path_applies(score, "auto")
    assert attention.local.blocked_path_applies("dot", "reference")


def test_mha_window_equals_mask_and_takes_no_mask_cache_or_kv():
    x = jax.random.normal(jax.random.key(0), (B, 9, N * H))
    seg, _ = _packed(9)
    module = _mha(num_kv_heads=2)
    variables = module.init(jax.random.key(1), x)
    window = attention.local.Window(2, segment_ids=seg)
    mask = masking.combine_masks(masking.window_mask(9, 2), masking.segment_mask(seg))
    np.testing.assert_allclose(
        module.apply(variables, x, window=window), module.apply(variables, x, mask=mask), atol=1e-5
    )
    for kwargs in [dict(mask=mask), dict(decode=True), dict(inputs_kv=x)]:
        with pytest.raises(ValueError, match="window"):
            module.apply(variables, x, window=window, mutable=["cache"], **kwargs)
    with pytest.raises(ValueError, match="radius"):
        attention.local.Window(0)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_cached_attention_over_a_head_major_cache_equals_jax_attention(num_kv_heads):
    b, length, s, n, h = 2, 3, 7, 4, 8
    keys = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(keys[0], (b, length, n, h))
    k = jax.random.normal(keys[1], (b, s, num_kv_heads, h))  # [B, S, K, H]
    v = jax.random.normal(keys[2], (b, s, num_kv_heads, h))
    bias = jax.random.normal(keys[3], (1, n, length, s))
    mask = jnp.arange(s)[None, None, None, :] <= jnp.arange(length)[None, None, :, None] + 3
    expected = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=h**-0.5)
    got = attention.cached_attention(
        q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask=mask, bias=bias, scale=h**-0.5
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("rows, length", [(1, 1), (4, 1), (1, 3)])
def test_cached_attention_contracts_the_left_operand_on_its_last_axis(rows, length):
    # Both products over the cache must be plain [M, K] x [K, N]-like batched matmuls, the
    # contracted axis last on the left: XLA:CPU gives those to its matmul library, while a left
    # operand contracted on another axis (the values' S, as `einsum` orders "...->BLKGH" for
    # beams sharing a row) became a naive loop, 5-7x slower at beam search's shapes.
    q = jnp.zeros((2 * rows, length, 4, 8))  # 2 cache rows, `rows` query rows reading each
    k = jnp.zeros((2, 2, 5, 8))
    jaxpr = jax.make_jaxpr(lambda q, k: attention.cache.attend_over_cache(q, k, k))(q, k)
    products = [
        (eqn.params["dimension_numbers"][0][0], eqn.invars[0].aval.ndim)
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "dot_general"
    ]
    assert len(products) == 2 and all(c == (n - 1,) for c, n in products), products


def test_cache_append_writes_at_the_index_and_rejects_what_does_not_fit():
    cached_k = jnp.zeros((B, 2, 6, H))  # [B, K, max_len, H]
    cached_v = jnp.ones((B, 2, 6, H), jnp.bfloat16)
    k = jnp.full((B, 2, 2, H), 5.0)  # [B, K, L, H]
    new_k, new_v, index = attention.cache.append(cached_k, cached_v, jnp.array(3), k, k)
    written = np.asarray(new_k[0, 0, :, 0])
    np.testing.assert_array_equal(written, [0, 0, 0, 5, 5, 0])
    assert new_v.dtype == jnp.bfloat16 and int(index) == 5
    with pytest.raises(ValueError, match="do not fit the cache"):
        long = jnp.zeros((B, 2, 7, H))
        attention.cache.append(cached_k, cached_v, jnp.array(0), long, long)


@pytest.mark.parametrize("score", attention.SCORES)
def test_attend_over_cache_equals_dot_product_attention(score):
    q, k, v = _qkv(num_kv=2)
    keys = jax.random.split(jax.random.key(5), 4)
    params = {
        "scaled_dot": None,
        "dot": None,
        "general": {"w": jax.random.normal(keys[0], (N, H, H))},
        "additive": {
            "w_q": jax.random.normal(keys[1], (N, H, 3)),
            "w_k": jax.random.normal(keys[2], (N, H, 3)),
            "v": jax.random.normal(keys[3], (N, 3)),
        },
    }[score]
    mask = _random_mask()
    kwargs = dict(mask=mask, score=score, score_params=params)
    expected = attention.dot_product_attention(q, k, v, **kwargs)
    head_major = attention.cache.head_major
    got = attention.cache.attend_over_cache(q, head_major(k), head_major(v), **kwargs)
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("score", attention.SCORES)
@pytest.mark.parametrize("rows_of_mask", [1, 6])
def test_a_cache_shared_by_beams_equals_one_row_per_beam(score, rows_of_mask):
    """Beam search's cross-attention cache: 3 sources, 2 beams each (query row 2b + i reads
    cache row b), with masks and biases that differ between the beams of a source."""
    sources, beams, length, s, n, kv, h = 3, 2, 2, 5, 4, 2, 8
    keys = jax.random.split(jax.random.key(11), 8)
    q = jax.random.normal(keys[0], (sources * beams, length, n, h))
    k = jax.random.normal(keys[1], (sources, kv, s, h))  # head-major, one row per source
    v = jax.random.normal(keys[2], (sources, kv, s, h))
    mask = jax.random.bernoulli(keys[3], 0.7, (rows_of_mask, 1, length, s)).at[..., 0].set(True)
    bias = jax.random.normal(keys[4], (rows_of_mask, n, length, s))
    params = {
        "general": {"w": jax.random.normal(keys[5], (n, h, h))},
        "additive": {
            "w_q": jax.random.normal(keys[6], (n, h, 3)),
            "w_k": jax.random.normal(keys[7], (n, h, 3)),
            "v": jax.random.normal(keys[5], (n, 3)),
        },
    }.get(score)
    kwargs = dict(mask=mask, bias=bias, score=score, score_params=params)
    shared = attention.cache.attend_over_cache(q, k, v, **kwargs)
    tiled = jnp.repeat(k, beams, axis=0), jnp.repeat(v, beams, axis=0)
    np.testing.assert_allclose(
        shared, attention.cache.attend_over_cache(q, *tiled, **kwargs), atol=1e-5
    )
    if score == "scaled_dot":  # and against JAX's own attention on the tiled rows
        seq_major = attention.cache.seq_major
        expected = jax.nn.dot_product_attention(
            q, *map(seq_major, tiled), bias=bias, mask=mask, scale=h**-0.5
        )
        np.testing.assert_allclose(shared, expected, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of them"):
        attention.cache.attend_over_cache(q[:5], k, v)


def test_head_sizes_defaults_and_errors():
    head_sizes = attention.projections.head_sizes
    assert head_sizes(16, 4, 0, 0) == (4, 4, 4)  # K = N, H = D // N
    assert head_sizes(16, 4, 1, 8) == (4, 1, 8)  # multi-query, explicit H
    with pytest.raises(ValueError, match="num_kv_heads"):
        head_sizes(16, 4, 3, 0)
    with pytest.raises(ValueError, match="divisible"):
        head_sizes(15, 4, 0, 0)


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.skipif(ON_GPU, reason="on a GPU the cudnn implementation runs")
def test_cudnn_off_a_gpu_says_so():
    q, k, v = _qkv(dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"needs an NVIDIA GPU.*implementation='auto'"):
        attention.dot_product_attention(q, k, v, implementation="cudnn")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(score="additive", score_params={}), "dot scores"),
        (
            dict(dropout_rate=0.1, dropout_rng=jax.random.key(0), deterministic=False),
            "with dropout",
        ),
    ],
)
def test_cudnn_rejects_what_it_cannot_run(kwargs, match):
    q, k, v = _qkv(dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        attention.dot_product_attention(q, k, v, implementation="cudnn", **kwargs)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_float32_inputs_get_a_clear_error():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention.dot_product_attention(q, k, v, implementation="cudnn")


def _assert_close_in_norm(got, want, rtol=2e-2, atol=1e-3):
    """Each leaf within rtol of the reference's norm: bf16 inputs, float32 comparison."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.float32(a), np.float32(b)
        assert np.linalg.norm(a - b) <= rtol * np.linalg.norm(b) + atol


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_matches_the_reference_path_with_its_gradients(causal):
    # Shapes cuDNN accepts (head dim 64, lengths a multiple of 64), padding from segment ids.
    b, length, n, h = 2, 128, 4, 64
    keys = jax.random.split(jax.random.key(11), 4)
    q, k, v = (jax.random.normal(key, (b, length, n, h), jnp.bfloat16) for key in keys[:3])
    segments = (jnp.arange(length)[None, :] < jnp.array([[length], [90]])).astype(jnp.int32)
    mask = masking.padding_mask(segments, segments)
    if causal:
        mask = mask & masking.causal_mask(length)

    def loss(q, k, v, implementation):
        out = attention.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(h, dtype=jnp.float32)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    got, want = grad(q, k, v, "cudnn"), grad(q, k, v, "reference")
    _assert_close_in_norm(got, want)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_gives_the_gradient_of_a_learned_bias():
    # A relative-position style bias [1, N, L, S], learned: its gradient must match too.
    b, length, n, h = 2, 128, 4, 64
    keys = jax.random.split(jax.random.key(12), 4)
    q, k, v = (jax.random.normal(key, (b, length, n, h), jnp.bfloat16) for key in keys[:3])
    bias = jax.random.normal(keys[3], (1, n, length, length), jnp.bfloat16)
    mask = masking.causal_mask(length)

    def loss(q, k, v, bias, implementation):
        out = attention.dot_product_attention(
            q, k, v, mask=mask, bias=bias, implementation=implementation
        )
        return jnp.sum(out.astype(jnp.float32) * jnp.sin(jnp.arange(h, dtype=jnp.float32)))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)
    got, want = grad(q, k, v, bias, "cudnn"), grad(q, k, v, bias, "reference")
    _assert_close_in_norm(got, want)
