"""Tests for tfjax.nn.positional against formulas written out independently with Python math."""

import math

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from tfjax.nn import positional

# Jitted once per shape: op-by-op dispatch compiles every primitive separately and is slow on CPU.
_rng = np.random.default_rng(0)  # fixed seed; numpy avoids compiling jax.random programs


def _normal(*shape):
    return jnp.asarray(_rng.standard_normal(shape), jnp.float32)


_apply_rope = jax.jit(positional.apply_rope, static_argnames="base")
_bucket = jax.jit(
    positional.relative_position_bucket,
    static_argnames=("bidirectional", "num_buckets", "max_distance"),
)

# ---------------------------------------------------------------------------------------------
# Sinusoidal encodings.


def _reference_table(length, dim, base, layout):
    """Vaswani et al. 2017, §3.5, one scalar at a time."""
    rows = []
    for pos in range(length):
        sines = [math.sin(pos / base ** (2 * i / dim)) for i in range(dim // 2)]
        cosines = [math.cos(pos / base ** (2 * i / dim)) for i in range(dim // 2)]
        if layout == "interleaved":
            rows.append([value for pair in zip(sines, cosines, strict=True) for value in pair])
        else:
            rows.append(sines + cosines)
    return np.array(rows)


@pytest.mark.parametrize("layout", positional.SINUSOIDAL_LAYOUTS)
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_sinusoidal_table_matches_formula(layout, base):
    table = positional.sinusoidal_table(7, 8, base=base, layout=layout)
    assert table.shape == (7, 8)
    assert table.dtype == jnp.float32
    np.testing.assert_allclose(table, _reference_table(7, 8, base, layout), atol=1e-5)


def test_sinusoidal_table_paper_layout_puts_sin_on_even_dims():
    table = positional.sinusoidal_table(3, 4)
    # Dimension 0 (i = 0) is sin(pos), dimension 1 is cos(pos).
    np.testing.assert_allclose(table[:, 0], [0.0, math.sin(1), math.sin(2)], atol=1e-6)
    np.testing.assert_allclose(table[:, 1], [1.0, math.cos(1), math.cos(2)], atol=1e-6)


def test_sinusoidal_table_dtype():
    table = positional.sinusoidal_table(4, 6, dtype=jnp.bfloat16)
    assert table.dtype == jnp.bfloat16


@pytest.mark.parametrize("layout", positional.SINUSOIDAL_LAYOUTS)
def test_sinusoidal_embedding_equals_table_rows(layout):
    positions = jnp.array([[0, 1, 2, 0, 1], [4, 3, 2, 1, 0]])  # first row: two packed segments
    table = positional.sinusoidal_table(5, 6, base=50.0, layout=layout)
    embedded = positional.sinusoidal_embedding(positions, 6, base=50.0, layout=layout)
    assert embedded.shape == (2, 5, 6)
    np.testing.assert_allclose(embedded, table[positions], atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 5}, "even"),
        ({"layout": "sandwich"}, "interleaved.*halves"),
        ({"base": 0.0}, "base"),
    ],
)
def test_sinusoidal_errors(kwargs, match):
    args = {"dim": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        positional.sinusoidal_table(3, **args)
    with pytest.raises(ValueError, match=match):
        positional.sinusoidal_embedding(jnp.zeros((1, 3), jnp.int32), **args)


# ---------------------------------------------------------------------------------------------
# Learned table and combination.


def test_learned_positional_embedding_shapes_and_lookup():
    module = positional.LearnedPositionalEmbedding(max_len=6, features=4)
    positions = jnp.array([[0, 1, 2], [5, 0, 3]])
    variables = module.init(jax.random.key(0), positions)
    table = variables["params"]["embedding"]
    assert table.shape == (6, 4)
    assert table.dtype == jnp.float32
    out = module.apply(variables, positions)
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, table[positions])


def test_learned_positional_embedding_dtypes():
    module = positional.LearnedPositionalEmbedding(max_len=4, features=2, dtype=jnp.bfloat16)
    positions = jnp.zeros((1, 2), jnp.int32)
    variables = module.init(jax.random.key(0), positions)
    assert variables["params"]["embedding"].dtype == jnp.float32
    assert module.apply(variables, positions).dtype == jnp.bfloat16


def test_learned_positional_embedding_out_of_range():
    module = positional.LearnedPositionalEmbedding(max_len=4, features=2)
    variables = module.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(ValueError, match="max_len=4"):
        module.apply(variables, jnp.array([[0, 4]]))
    # Under jit the documented behaviour is clipping to the last row.
    out = jax.jit(module.apply)(variables, jnp.array([[3, 9]]))
    np.testing.assert_array_equal(out[0, 1], variables["params"]["embedding"][3])
    # Concrete positions whose min/max are traced (a sample batch closed over by an init under
    # vmap + eval_shape, as vectorised sweeps do): no check, no error.
    sample = jnp.array([[0, 1, 1]])
    keys = jax.random.split(jax.random.key(0), 2)
    shapes = jax.eval_shape(jax.vmap(lambda rng: module.init(rng, sample)), keys)
    assert shapes["params"]["embedding"].shape == (2, 4, 2)


def test_combine_embeddings_add_and_concat():
    tokens = jnp.ones((2, 3, 4))
    positions = positional.sinusoidal_table(3, 4)[None]  # [1, 3, 4]
    added = positional.combine_embeddings(tokens, positions)
    assert added.shape == (2, 3, 4)
    np.testing.assert_allclose(added[1], 1.0 + positions[0])
    concatenated = positional.combine_embeddings(tokens, positions[..., :2], mode="concat")
    assert concatenated.shape == (2, 3, 6)
    np.testing.assert_array_equal(concatenated[:, :, :4], tokens)
    np.testing.assert_array_equal(concatenated[1, :, 4:], positions[0, :, :2])


def test_combine_embeddings_errors():
    tokens = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"width 4.*got 2"):
        positional.combine_embeddings(tokens, jnp.ones((2, 3, 2)))
    with pytest.raises(ValueError, match=r"add.*concat"):
        positional.combine_embeddings(tokens, jnp.ones((2, 3, 4)), mode="multiply")


# ---------------------------------------------------------------------------------------------
# T5 relative position buckets and bias.


def _t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Raffel et al. 2020, §2.1, for one Python int offset (key - query)."""
    n = -relative_position
    offset = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            offset = num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return offset + n
    spread = math.log(n / max_exact) / math.log(max_distance / max_exact)
    return offset + min(max_exact + int(spread * (num_buckets - max_exact)), num_buckets - 1)


def test_relative_buckets_bidirectional_by_hand():
    # 16 buckets, 8 per side: 0..3 exact; 4 + floor(log(d/4) / log(8) * 4) for 4 <= d < 32.
    offsets = [0, -1, -3, -4, -6, -7, -11, -12, -20, -100, 1, 3, 4, 7, 12, 20, 100]
    expected = [0, 1, 3, 4, 4, 5, 5, 6, 7, 7, 9, 11, 12, 13, 14, 15, 15]
    buckets = _bucket(jnp.array(offsets), num_buckets=16, max_distance=32)
    assert buckets.dtype == jnp.int32
    np.testing.assert_array_equal(buckets, expected)
    assert expected == [_t5_bucket(o, True, 16, 32) for o in offsets]


def test_relative_buckets_causal_by_hand():
    # 8 buckets, all for the past: 0..3 exact, 4..7 logarithmic up to distance 32.
    offsets = [5, 1, 0, -3, -7, -12, -20, -50]
    expected = [0, 0, 0, 3, 5, 6, 7, 7]
    buckets = _bucket(jnp.array(offsets), bidirectional=False, num_buckets=8, max_distance=32)
    np.testing.assert_array_equal(buckets, expected)
    assert expected == [_t5_bucket(o, False, 8, 32) for o in offsets]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_match_reference_over_a_range(bidirectional):
    offsets = np.arange(-300, 301)
    buckets = _bucket(jnp.asarray(offsets).reshape(601, 1), bidirectional=bidirectional)
    assert buckets.shape == (601, 1)
    expected = [_t5_bucket(int(o), bidirectional, 32, 128) for o in offsets]
    np.testing.assert_array_equal(buckets[:, 0], expected)
    assert 0 <= int(buckets.min()) and int(buckets.max()) < 32


def test_relative_buckets_causal_future_is_zero_and_monotone():
    future = _bucket(jnp.arange(0, 50), bidirectional=False)
    np.testing.assert_array_equal(future, 0)
    past = _bucket(-jnp.arange(0, 300), bidirectional=False)
    assert np.all(np.diff(np.asarray(past)) >= 0)
    assert int(past[-1]) == 31


def test_relative_buckets_bidirectional_monotone_per_side():
    past = np.asarray(_bucket(-jnp.arange(0, 300)))
    future = np.asarray(_bucket(jnp.arange(1, 300)))
    assert np.all(np.diff(past) >= 0) and np.all(np.diff(future) >= 0)
    assert past.max() < 16 <= future.min()


@pytest.mark.parametrize(
    "kwargs",
    [{"num_buckets": 15}, {"num_buckets": 2}, {"num_buckets": 8, "max_distance": 2}],
)
def test_relative_buckets_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError, match=r"num_buckets|max_distance"):
        positional.relative_position_bucket(jnp.arange(3), **kwargs)


def test_relative_position_bias_shape_and_offsets():
    module = positional.RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    q_positions = jnp.array([[0, 1, 2], [0, 1, 0]])  # second row: packed, restarts
    kv_positions = jnp.array([[0, 1, 2, 3], [0, 1, 0, 1]])
    variables = jax.jit(module.init)(jax.random.key(1), q_positions, kv_positions)
    table = variables["params"]["rel_embedding"]
    assert table.shape == (8, 2)
    bias = jax.jit(module.apply)(variables, q_positions, kv_positions)
    assert bias.shape == (2, 2, 3, 4)
    assert bias.dtype == jnp.float32
    # Same offset, same bias: (q 0, k 1) vs (q 1, k 2), and across rows.
    np.testing.assert_array_equal(bias[0, :, 0, 1], bias[0, :, 1, 2])
    np.testing.assert_array_equal(bias[0, :, 0, 1], bias[1, :, 2, 3])
    for i in range(3):
        for j in range(4):
            offset = int(kv_positions[0, j] - q_positions[0, i])
            np.testing.assert_array_equal(bias[0, :, i, j], table[_t5_bucket(offset, True, 8, 16)])


def test_relative_offset_bias_is_the_dense_bias_at_any_offsets():
    module = positional.RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    q_positions = jnp.array([[0, 1, 2, 0]])
    kv_positions = jnp.array([[0, 1, 2, 0, 1, 9]])
    variables = module.init(jax.random.key(2), q_positions, kv_positions)
    table = variables["params"]["rel_embedding"]
    dense = module.apply(variables, q_positions, kv_positions)  # [1, 2, 4, 6]
    offset_bias = module.apply(variables, method=module.offset_bias)
    offsets = kv_positions[:, None, :] - q_positions[:, :, None]  # [1, 4, 6]
    np.testing.assert_array_equal(jnp.moveaxis(offset_bias(offsets), -1, 1), dense)
    # Any offsets, any shape: each is the table row of its T5 bucket.
    offsets = jnp.array([[-20, -3], [0, 5]])
    got = offset_bias(offsets)  # [2, 2, N]
    for index in np.ndindex(2, 2):
        bucket = _t5_bucket(int(offsets[index]), True, 8, 16)
        np.testing.assert_array_equal(got[index], table[bucket])


# ---------------------------------------------------------------------------------------------
# RoPE.


def _rope_reference(x, positions, base=10000.0):
    """RoFormer §3.4 as complex rotation of (x_i, x_{i + H/2}) by position * base^(-2i/H)."""
    half = x.shape[-1] // 2
    pairs = x[..., :half] + 1j * x[..., half:]
    theta = np.array([base ** (-2 * i / x.shape[-1]) for i in range(half)])
    rotated = pairs * np.exp(1j * positions[:, :, None, None] * theta)
    return np.concatenate([rotated.real, rotated.imag], axis=-1)


def _rope_score(q, k, m, n):
    q_rot = _apply_rope(q, jnp.array([[m]]))
    k_rot = _apply_rope(k, jnp.array([[n]]))
    return float(jnp.sum(q_rot * k_rot))


def test_rope_matches_complex_reference():
    x = _normal(2, 3, 2, 8)
    positions = jnp.array([[0, 1, 5], [7, 2, 0]])
    expected = _rope_reference(np.asarray(x, np.float64), np.asarray(positions), base=100.0)
    np.testing.assert_allclose(_apply_rope(x, positions, base=100.0), expected, atol=1e-5)


def test_rope_scores_depend_only_on_offset():
    q, k = _normal(1, 1, 1, 8), _normal(1, 1, 1, 8)
    same_offset = [_rope_score(q, k, m, m + 3) for m in (0, 2, 7, 40)]
    np.testing.assert_allclose(same_offset, same_offset[0], rtol=1e-4)
    other_offsets = [_rope_score(q, k, 0, n) for n in (0, 1, 5)]
    assert min(abs(other - same_offset[0]) for other in other_offsets) > 1e-3


def test_rope_preserves_norms_and_is_identity_at_zero():
    x = _normal(2, 4, 1, 4)  # keys [B, S, K, H]
    positions = jnp.array([[3, 1, 4, 1], [5, 9, 2, 6]])
    rotated = _apply_rope(x, positions)
    np.testing.assert_allclose(
        jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
    )
    at_zero = _apply_rope(x, jnp.zeros((2, 4), jnp.int32))
    np.testing.assert_allclose(at_zero, x, atol=1e-7)


def test_rope_keeps_dtype_and_rejects_odd_head_dim():
    x = jnp.ones((1, 2, 2, 4), jnp.bfloat16)
    assert positional.apply_rope(x, jnp.array([[0, 1]])).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="even head_dim"):
        positional.apply_rope(jnp.ones((1, 2, 2, 5)), jnp.array([[0, 1]]))


# ---------------------------------------------------------------------------------------------
# ALiBi.


def test_alibi_slopes_power_of_two():
    np.testing.assert_allclose(positional.alibi_slopes(8), [2.0**-k for k in range(1, 9)])
    np.testing.assert_allclose(positional.alibi_slopes(4), [2.0**-k for k in (2, 4, 6, 8)])


def test_alibi_slopes_six_heads_follow_the_paper_recipe():
    # The 4 slopes of n = 4, then every other slope of n = 8 (1/2, 1/8) to make 6.
    expected = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    np.testing.assert_allclose(positional.alibi_slopes(6), expected)
    assert positional.alibi_slopes(6).dtype == jnp.float32


def test_alibi_slopes_errors():
    with pytest.raises(ValueError, match="num_heads"):
        positional.alibi_slopes(0)


def test_alibi_bias_literal():
    positions = jnp.array([[0, 1, 2]])
    bias = positional.alibi_bias(positions, positions, jnp.array([0.5, 0.25]))
    assert bias.shape == (1, 2, 3, 3)
    assert bias.dtype == jnp.float32
    expected_head0 = [[0.0, -0.5, -1.0], [-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]]
    expected_head1 = [[0.0, -0.25, -0.5], [-0.25, 0.0, -0.25], [-0.5, -0.25, 0.0]]
    np.testing.assert_allclose(bias[0], [expected_head0, expected_head1])


def test_alibi_bias_rectangular_packed():
    bias = positional.alibi_bias(jnp.array([[0, 1]]), jnp.array([[0, 1, 0]]), jnp.array([1.0]))
    np.testing.assert_allclose(bias[0, 0], [[0.0, -1.0, 0.0], [-1.0, 0.0, -1.0]])


def test_alibi_offset_bias_is_the_dense_bias_at_any_offsets():
    slopes = jnp.array([0.5, 0.25])
    positions = jnp.array([[0, 1, 2, 0, 1]])
    dense = positional.alibi_bias(positions, positions, slopes)  # [1, 2, 5, 5]
    offsets = positions[:, None, :] - positions[:, :, None]  # key - query, [1, 5, 5]
    got = positional.alibi_offset_bias(offsets, slopes)  # [1, 5, 5, 2]
    np.testing.assert_array_equal(jnp.moveaxis(got, -1, 1), dense)
    np.testing.assert_allclose(
        positional.alibi_offset_bias(jnp.array([-3, 2]), slopes), [[-1.5, -0.75], [-1.0, -0.5]]
    )


# ---------------------------------------------------------------------------------------------
# Shape errors: TypeError from the annotation checks, ValueError from the functions themselves.


def test_shape_errors():
    x, positions = jnp.ones((1, 2, 2, 4)), jnp.array([[0, 1, 2]])
    short, long = jnp.zeros((1, 3), jnp.int32), jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(TypeError):
        positional.apply_rope(x, positions)
    with pytest.raises(TypeError):
        positional.alibi_bias(short, long, jnp.ones(2))
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        with pytest.raises(ValueError, match=r"positions must have shape \(1, 2\)"):
            positional.apply_rope(x, positions)
        with pytest.raises(ValueError, match=r"expected 1.*got 2"):
            positional.alibi_bias(short, long, jnp.ones(2))
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)
