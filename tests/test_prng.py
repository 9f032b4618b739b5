"""`tfjax.nn.prng`: dropout masks equal to `jax.random.bernoulli`'s, bit for bit, drawn once.

References: the Threefry-2x32-20 known-answer vectors of Salmon et al. (Random123's
`kat_vectors`), and JAX's own `jax.random.bits` / `jax.random.bernoulli` on the same keys.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from tfjax.nn import layers, prng

# (counter, key, expected output) of Random123's known-answer tests for threefry2x32, 20 rounds.
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 64), (4, 1, 9, 2)]


@pytest.mark.parametrize("counter, key, want", KNOWN_ANSWERS)
def test_threefry_known_answers(counter, key, want):
    k0, k1 = (jnp.uint32(v) for v in key)
    c0, c1 = (jnp.asarray([v], jnp.uint32) for v in counter)
    got = prng.threefry2x32(k0, k1, c0, c1)
    assert [int(g[0]) for g in got] == list(want)


def _keys():
    return {
        "typed": jax.random.key(11),
        "raw": jax.random.PRNGKey(11),
        "folded": jax.random.fold_in(jax.random.key(5), 123456),
    }


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["typed", "raw", "folded"])
def test_random_bits_are_jax_random_bits(kind, shape):
    key = _keys()[kind]
    want = jax.random.bits(key, shape, jnp.uint32)
    np.testing.assert_array_equal(prng.random_bits(key, shape), want)
    got = jax.jit(prng.random_bits, static_argnums=1)(key, shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["typed", "raw", "folded"])
@pytest.mark.parametrize("p", [0.9, 0.5, 0.013, 0.0, 1.0])
def test_bernoulli_is_jax_random_bernoulli(kind, shape, p):
    key = _keys()[kind]
    want = jax.random.bernoulli(key, p, shape)
    np.testing.assert_array_equal(prng.bernoulli(key, p, shape), want)
    jitted = jax.jit(prng.bernoulli, static_argnums=2)
    np.testing.assert_array_equal(jitted(key, jnp.float32(p), shape), want)  # traced p


def test_bernoulli_frequency_and_independence():
    """Not just equal to JAX: the kept fraction is p, and neighbouring elements are unrelated."""
    mask = np.asarray(prng.bernoulli(jax.random.key(0), 0.9, (512, 512)))
    assert abs(mask.mean() - 0.9) < 0.003  # 262,144 draws: 5 standard deviations is 0.003
    both = (mask[:, 1:] & mask[:, :-1]).mean()
    assert abs(both - 0.81) < 0.004


def test_bernoulli_under_vmap_with_a_rate_per_trial():
    keys = jax.random.split(jax.random.key(2), 4)
    rates = jnp.asarray([0.1, 0.5, 0.0, 0.9], jnp.float32)
    got = jax.jit(jax.vmap(lambda k, p: prng.bernoulli(k, p, (6, 10))))(keys, rates)
    want = jax.vmap(lambda k, p: jax.random.bernoulli(k, p, (6, 10)))(keys, rates)
    np.testing.assert_array_equal(got, want)


def test_other_keys_and_dtypes_fall_back_to_jax():
    rbg = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(
        prng.bernoulli(rbg, 0.7, (4, 8)), jax.random.bernoulli(rbg, 0.7, (4, 8))
    )
    key = jax.random.key(3)
    half = jnp.float16(0.7)
    np.testing.assert_array_equal(
        prng.bernoulli(key, half, (4, 8)), jax.random.bernoulli(key, half, (4, 8))
    )


def test_sharded_mask_equals_the_unsharded_one():
    """On the 8 simulated CPU devices (conftest): the counter is a sum of iotas, which XLA's
    partitioner splits with the array; the mask must not depend on the split."""
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.device_put(jnp.ones((16, 12, 8)), NamedSharding(mesh, PartitionSpec("data")))
    key = jax.random.key(9)

    @jax.jit
    def drop(key, x):
        return jnp.where(prng.bernoulli(key, 0.8, x.shape), x / 0.8, 0.0)

    want = jnp.where(jax.random.bernoulli(key, 0.8, x.shape), 1 / 0.8, 0.0)
    np.testing.assert_array_equal(drop(key, x), want)


def _threefry_evaluations(hlo: str) -> int:
    """How many unrolled Threefry evaluations a compiled module holds: 20 rotations (a right
    shift each) per evaluation, counted per computation (a fused consumer that recomputes two
    masks holds 40 or more; JAX's own rolled loop for `fold_in` holds 4 per body, not counted)."""
    parts = re.split(r"\n(?=\S.*\{\n)", hlo)
    return sum(part.count("shift-right-logical(") // 20 for part in parts)


def test_each_mask_is_computed_once_on_the_cpu():
    """The mask feeds the forward select and the backward one; XLA would fuse the 20 rounds into
    both (and into more) unless they sit in their own computation (`_drawn_once`)."""

    def loss(x, key):
        a = layers.Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": key})
        b = layers.Dropout(0.1).apply(
            {}, jnp.tanh(a), deterministic=False, rngs={"dropout": jax.random.fold_in(key, 1)}
        )
        return jnp.sum(jnp.sin(b) * a)

    x = jnp.linspace(-1.0, 1.0, 64 * 48).reshape(64, 48)
    hlo = jax.jit(jax.grad(loss)).lower(x, jax.random.key(0)).compile().as_text()
    assert _threefry_evaluations(hlo) == 2  # two dropout sites


def test_dropout_values_and_gradients_equal_flax_dropout():
    """tfjax's Dropout (masks from `prng.bernoulli`) against Flax's `nn.Dropout` (masks from
    `jax.random.bernoulli`) from the same key, jitted: the same outputs, the same gradients
    (up to the order of a float sum)."""
    key = jax.random.key(4)
    x = jnp.linspace(-2.0, 2.0, 96).reshape(8, 12)

    def forward(module, x):
        return module.apply({}, x, deterministic=False, rngs={"dropout": key})

    def grad(module):
        return jax.jit(jax.grad(lambda x: jnp.sum(jnp.cos(forward(module, x)) * x)))

    ours, flax_y = jax.jit(
        lambda x: (forward(layers.Dropout(0.25), x), forward(nn.Dropout(0.25), x))
    )(x)
    np.testing.assert_array_equal(ours, flax_y)
    assert 0 < int(jnp.sum(ours == 0.0)) < x.size  # some elements dropped, not all
    np.testing.assert_allclose(grad(layers.Dropout(0.25))(x), grad(nn.Dropout(0.25))(x), rtol=1e-6)


def test_the_original_threefry_layout_falls_back_to_jax():
    """With `jax_threefry_partitionable` off JAX lays its bits out differently; the module must
    then hand over to `jax.random.bernoulli` rather than draw other masks."""
    key = jax.random.key(6)
    with jax.threefry_partitionable(False):
        np.testing.assert_array_equal(
            prng.bernoulli(key, 0.6, (5, 7)), jax.random.bernoulli(key, 0.6, (5, 7))
        )
        np.testing.assert_array_equal(
            prng.random_bits(key, (5, 7)), jax.random.bits(key, (5, 7), jnp.uint32)
        )


def test_the_stock_path_is_jax_random_bernoulli_and_draws_the_same_mask():
    """`fast_path=False` is `jax.random.bernoulli` itself (the same program), and both paths
    draw the same mask."""
    key, shape = jax.random.key(5), (6, 9)
    stock = jax.make_jaxpr(lambda k: prng.bernoulli(k, 0.3, shape, fast_path=False))(key)
    assert str(stock) == str(jax.make_jaxpr(lambda k: jax.random.bernoulli(k, 0.3, shape))(key))
    fast = jax.make_jaxpr(lambda k: prng.bernoulli(k, 0.3, shape))(key)
    assert str(fast) != str(stock)
    np.testing.assert_array_equal(
        jax.jit(lambda k: prng.bernoulli(k, 0.3, shape))(key),
        jax.jit(lambda k: prng.bernoulli(k, 0.3, shape, fast_path=False))(key),
    )
