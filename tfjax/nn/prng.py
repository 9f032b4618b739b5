"""Dropout's random draws: `jax.random.bernoulli`'s masks, bit for bit, as one fused kernel.

`bernoulli(key, p, shape)` returns exactly `jax.random.bernoulli(key, p, shape)` (the same
mask from the same key, so tfjax's dropout still draws Flax's `nn.Dropout` masks) when the key
is a Threefry-2x32 key and JAX runs in its default partitionable Threefry mode
(`jax_threefry_partitionable`); for any other key implementation, mode, a non-float32 `p`, or
2^32 elements and more it calls `jax.random.bernoulli` itself.

Why: on the CPU JAX lowers Threefry as a rolled loop (5 iterations of 4 rounds; it keeps
compilation short) that XLA:CPU runs as a `while` of several small kernels per iteration, each
reading and writing the whole state. Written out here in `jax.numpy`, the 20 rounds unroll into
one elementwise fusion per dropout site that keeps the state in registers (measurements:
docs/performance.md, "Measurements behind the fast paths"). GPUs and TPUs already run JAX's
unrolled lowering, which computes the same, and get `jax.random.bernoulli` itself.

The generator (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3", Threefry-2x32
with 20 rounds): the counter of element i is the 64-bit pair (hi, lo) of its row-major index,
the 32 random bits are the xor of the two output words (JAX's partitionable bit layout), and the
uniform float in [0, 1) takes the top 23 bits as its mantissa, as `jax.random.uniform` does.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool

# Rotation distances of the even and odd groups of four rounds, and the key-schedule parity.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_GROUPS = 5  # 5 groups of 4 rounds: Threefry-2x32-20
_ONE = 0x3F800000  # the bits of float32 1.0


def threefry2x32(k0: Array, k1: Array, c0: Array, c1: Array) -> tuple[Array, Array]:
    """Threefry-2x32 (20 rounds) of the counters (c0, c1) under the key (k0, k1), all uint32."""
    keys = (k0, k1, k0 ^ k1 ^ jnp.uint32(_PARITY))
    x0, x1 = c0 + keys[0], c1 + keys[1]
    for group in range(_GROUPS):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = (x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))
            x1 = x1 ^ x0
        x0 = x0 + keys[(group + 1) % 3]
        x1 = x1 + keys[(group + 2) % 3] + jnp.uint32(group + 1)
    return x0, x1


def _threefry_key_data(key: Array, shape: tuple[int, ...]) -> Array | None:
    """The uint32[2] data of a Threefry key (typed, or a raw key of the default implementation)
    when this module draws `shape` itself; None when JAX must: another key implementation, JAX's
    original (non-partitionable) Threefry layout, or 2^32 elements and more."""
    # getattr: a later JAX may drop the flag once the partitionable layout is its only one.
    if not getattr(jax.config, "jax_threefry_partitionable", True) or math.prod(shape) >= 2**32:
        return None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != () or "threefry2x32" not in str(jax.random.key_impl(key)):
            return None
        return jax.random.key_data(key)
    if key.shape != (2,) or key.dtype != jnp.uint32:
        return None
    if getattr(jax.config, "jax_default_prng_impl", "threefry2x32") != "threefry2x32":
        return None
    return key


def _bits(data: Array, shape: tuple[int, ...]) -> Array:
    """JAX's 32-bit draw for the key with uint32[2] `data`: the xor of the two Threefry output
    words of each element's counter (0, its row-major index)."""
    index = jnp.zeros(shape, jnp.uint32)  # the row-major index, as a sum of broadcast iotas
    stride = 1  # (which XLA's SPMD partitioner splits along with the array)
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    hi, lo = threefry2x32(data[0], data[1], jnp.zeros_like(index), index)
    return hi ^ lo


def random_bits(key: Array, shape: tuple[int, ...]) -> Array:
    """uint32 random bits: `jax.random.bits(key, shape, jnp.uint32)`, bit for bit, drawn as
    `bernoulli` draws: one unrolled elementwise Threefry fusion on a CPU for a Threefry key in
    the partitionable mode, `jax.random.bits` itself otherwise (module docstring). For masks
    other than dropout's (token dropping, stochastic depth, ...) that want the same fast path.

    Args:
        key: a typed or raw (uint32[2]) PRNG key.
        shape: the shape of the result.

    Returns:
        uint32 array of `shape`.
    """
    shape = tuple(shape)
    data = _threefry_key_data(key, shape)
    return jax.random.bits(key, shape, jnp.uint32) if data is None else _bits(data, shape)


def _uniform_below(data: Array, p: Array, shape: tuple[int, ...]) -> Array:
    """`jax.random.uniform(key, shape) < p` for the Threefry key with uint32[2] `data`."""
    # The top 23 of the 32 bits as the mantissa under the exponent of 1.0: a float in [1, 2).
    mantissa = _bits(data, shape) >> jnp.uint32(9)
    floats = lax.bitcast_convert_type(mantissa | jnp.uint32(_ONE), jnp.float32)
    return floats - 1.0 < p


@functools.partial(jax.jit, static_argnums=2)
def _drawn_once(data: Array, p: Array, shape: tuple[int, ...]) -> Array:
    """`_uniform_below` inside a conditional whose predicate is always true.

    XLA fuses the unrolled rounds into every consumer of the mask (the forward select and the
    backward one: each mask was computed ~3 times a step) and drops optimization barriers on
    the CPU; it fuses nothing into a conditional, so the mask is computed once and stored. The
    predicate depends on the key's data, so XLA cannot fold the conditional away. Jitted, so
    that the dropout sites of one shape share one traced and lowered function (a train step's
    compile time is part of the benchmark).
    """
    always = (data[0] | jnp.uint32(1)) != 0
    return lax.cond(
        always,
        lambda: _uniform_below(data, p, shape),
        lambda: jnp.zeros(shape, bool),
    )


def bernoulli(
    key: Array, p: float | Array, shape: tuple[int, ...], *, fast_path: bool = True
) -> Bool[Array, "..."]:
    """True with probability `p`: `jax.random.bernoulli(key, p, shape)`, bit for bit.

    On the CPU the mask is computed by this module's unrolled Threefry (see the module
    docstring); on other platforms, and for keys, modes or probabilities it does not cover, by
    `jax.random.bernoulli` itself.

    Args:
      key: a JAX PRNG key (typed, or raw uint32[2]).
      p: the probability, a Python float or a float32 scalar (traced or not).
      shape: the mask's shape.
      fast_path: False calls the stock `jax.random.bernoulli` on every platform.
    """
    shape = tuple(shape)
    p = jnp.asarray(p)
    data = _threefry_key_data(key, shape) if fast_path else None
    if data is None or p.dtype != jnp.float32 or p.ndim != 0:
        return jax.random.bernoulli(key, p, shape)
    return lax.platform_dependent(
        data,
        p,
        cpu=lambda data, p: _drawn_once(data, p, shape),
        default=lambda data, p: jax.random.bernoulli(key, p, shape),
    )
