"""The post-LN residual step LayerNorm(x + dropout(y)) as one Pallas kernel, forward and backward.

XLA runs this step as separate passes over the activations: dropout and the residual add, the
norm's statistics, the normalisation (and in the backward pass the mirror images, plus a saved
dropout mask). On a GPU each pass is memory-bound, so the step costs several times what its
bytes need. `dropout_add_layer_norm` does it in one pass each way: the forward kernel reads x
and y and writes the output and the sum z = x + dropout(y); the backward kernel reads z and the
output gradient, recomputes the row statistics and the dropout mask, and writes the gradients of
x and y and per-block partial sums of the scale and bias gradients.

The dropout mask is not stored: element i (its row-major index in the flattened [N, D] input)
is kept when a counter-based hash of (i, seed) is at least rate * 2^32, so the backward kernel
regenerates it (the index is taken modulo 2^32: beyond 2^32 elements the masks repeat). The
hash is two rounds of Wellons' "lowbias32" integer mixer, keyed by two 32-bit seeds;
`keep_mask` computes the same mask with jax.numpy (the tests' reference). Its masks are not
those of `jax.random.bernoulli` (Flax's `nn.Dropout`), so a model switched to this
kernel trains with different (equally distributed) dropout draws.

On a GPU the kernels compile through Pallas's Triton backend, which needs the width D to be a
power of two; elsewhere they run in Pallas's interpreter (`interpret=True`: correct, for tests,
not fast). Statistics are in float32, as in `norms.layer_norm`. jax 0.11 deprecates Pallas's
Triton backend in favour of Mosaic GPU; this module is imported only when
`residual_impl="pallas"` asks for it, and a Mosaic GPU port is the follow-up.
"""

import functools
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton
from jaxtyping import Array, Float

from tfjax.nn import norms

_MIX_1 = 0x7FEB352D
_MIX_2 = 0x846CA68B
# Tuning knobs, each overridable as TFJAX_FUSED_<NAME> in the environment (read when traced):
# ELEMENTS per chunk of rows (rows = ELEMENTS // D, a power of two), Triton WARPS per program,
# backward STEPS: chunks per program, whose scale and bias gradients it sums before writing.
_DEFAULTS = {"ELEMENTS": 1024, "WARPS": 4, "STEPS": 16}  # tuned on an H100 (docs/performance.md)
INTERPRET: bool | None = None  # None: interpret unless the default backend is a GPU


def _mix32(h: Array) -> Array:
    """Wellons' lowbias32 mixer on uint32 (a bijection with good avalanche)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_MIX_1)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(_MIX_2)
    return h ^ (h >> 16)


def _hash_bits(index: Array, seed0: Array, seed1: Array) -> Array:
    """32 random bits for each uint32 `index` under the key (seed0, seed1)."""
    return _mix32(_mix32(index ^ seed0) + seed1)


def _threshold(rate: float) -> int:
    return min(round(rate * 2**32), 2**32 - 1)


def _keep(rows: Array, cols: Array, d: int, seed0: Array, seed1: Array, rate: float) -> Array:
    """Whether element (row, col) of a width-d array is kept: its hashed index >= rate * 2^32."""
    bits = _hash_bits(rows * jnp.uint32(d) + cols, seed0, seed1)
    return bits >= jnp.uint32(_threshold(rate))


def keep_mask(seeds: Array, shape: tuple[int, int], rate: float) -> Array:
    """The boolean [N, D] dropout mask the kernels use (True: kept), in jax.numpy."""
    n, d = shape
    rows = jnp.arange(n, dtype=jnp.uint32)[:, None]
    cols = jnp.arange(d, dtype=jnp.uint32)[None, :]
    return _keep(rows, cols, d, seeds[0], seeds[1], rate)


def make_seeds(rng: Array) -> Array:
    """Two uint32 seeds for the kernels from a JAX PRNG key."""
    return jax.random.bits(rng, (2,), jnp.uint32)


def reference(
    x: Float[Array, "*B D"],
    y: Float[Array, "*B D"],
    scale: Float[Array, " D"],
    bias: Float[Array, " D"],
    seeds: Array,
    *,
    rate: float,
    eps: float = 1e-6,
) -> Float[Array, "*B D"]:
    """LayerNorm(x + dropout(y)) with `keep_mask`'s mask, written with jax.numpy (autodiff)."""
    d = x.shape[-1]
    y2 = y.reshape(-1, d)
    if rate > 0:
        keep = keep_mask(seeds, y2.shape, rate)
        y2 = jnp.where(keep, (y2 / (1.0 - rate)).astype(y.dtype), jnp.zeros_like(y2))
    z = x + y2.reshape(x.shape)
    return norms.layer_norm(z, scale, bias, eps)


def _setting(name: str) -> int:
    """A tuning knob: `TFJAX_FUSED_<name>` from the environment, else the module's default."""
    return int(os.environ.get(f"TFJAX_FUSED_{name}", _DEFAULTS[name]))


def _block_rows(d: int) -> int:
    rows = max(1, _setting("ELEMENTS") // d)
    return 1 << (rows.bit_length() - 1)  # a power of two


def _row_mask(seed_ref, first_row: Array, shape: tuple[int, int], rate: float) -> Array:
    """The kept elements of the [R, D] rows from `first_row` on (see `keep_mask`)."""
    rows = first_row.astype(jnp.uint32) + jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.uint32, shape, 1)
    return _keep(rows, cols, shape[1], seed_ref[0], seed_ref[1], rate)


def _forward_kernel(seed_ref, x_ref, y_ref, scale_ref, bias_ref, out_ref, z_ref, *, rate, eps):
    x = x_ref[...].astype(jnp.float32)
    y = y_ref[...]
    if rate > 0:
        keep = _row_mask(seed_ref, pl.program_id(0) * y.shape[0], y.shape, rate)
        dropped = (y.astype(jnp.float32) * (1.0 / (1.0 - rate))).astype(y.dtype)
        y = jnp.where(keep, dropped, jnp.zeros_like(dropped))
    z = (x + y.astype(jnp.float32)).astype(z_ref.dtype)
    z_ref[...] = z
    z32 = z.astype(jnp.float32)
    mean = jnp.mean(z32, axis=1, keepdims=True)
    centred = z32 - mean
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=1, keepdims=True) + eps)
    scale = scale_ref[...].astype(jnp.float32)
    bias = bias_ref[...].astype(jnp.float32)
    out_ref[...] = (centred * rstd * scale + bias).astype(out_ref.dtype)


def _backward_kernel(
    seed_ref, z_ref, g_ref, scale_ref, dx_ref, dy_ref, dscale_ref, dbias_ref, *, rate, eps, rows
):
    """One program: `steps` chunks of `rows` rows, the scale and bias gradients summed over all."""
    d = z_ref.shape[1]
    steps = z_ref.shape[0] // rows
    scale = scale_ref[...].astype(jnp.float32)
    block_first = pl.program_id(0) * z_ref.shape[0]  # outside the loop (the interpreter's need)

    def chunk(step, sums):
        at = pl.ds(step * rows, rows)
        z = z_ref[at, :].astype(jnp.float32)
        g = g_ref[at, :].astype(jnp.float32)
        mean = jnp.sum(z, axis=1, keepdims=True) / d
        centred = z - mean
        rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1, keepdims=True) / d + eps)
        xhat = centred * rstd
        gs = g * scale
        dz = rstd * (
            gs
            - jnp.sum(gs, axis=1, keepdims=True) / d
            - xhat * (jnp.sum(gs * xhat, axis=1, keepdims=True) / d)
        )
        dx_ref[at, :] = dz.astype(dx_ref.dtype)
        if rate > 0:
            keep = _row_mask(seed_ref, block_first + step * rows, dz.shape, rate)
            dz = jnp.where(keep, dz * (1.0 / (1.0 - rate)), jnp.zeros_like(dz))
        dy_ref[at, :] = dz.astype(dy_ref.dtype)
        dscale, dbias = sums
        return (
            dscale + jnp.sum(g * xhat, axis=0, keepdims=True),
            dbias + jnp.sum(g, axis=0, keepdims=True),
        )

    zeros = jnp.zeros((1, d), jnp.float32)
    dscale, dbias = jax.lax.fori_loop(0, steps, chunk, (zeros, zeros))
    dscale_ref[...] = dscale
    dbias_ref[...] = dbias


def _specs(rows: int, d: int):
    seeds = pl.BlockSpec((2,), lambda i: (0,))
    block = pl.BlockSpec((rows, d), lambda i: (i, 0))
    vector = pl.BlockSpec((1, d), lambda i: (0, 0))
    partial = pl.BlockSpec((1, d), lambda i: (i, 0))
    return seeds, block, vector, partial


def _interpret() -> bool:
    """Pallas's interpreter everywhere but on GPUs (tests set `INTERPRET` to lower for CUDA)."""
    return INTERPRET if INTERPRET is not None else jax.default_backend() != "gpu"


def _compiler_params() -> pl_triton.CompilerParams:
    # Naming Triton's parameters picks Pallas's Triton backend on GPUs (not Mosaic GPU).
    return pl_triton.CompilerParams(num_warps=_setting("WARPS"), num_stages=1)


def _forward(x2, y2, scale, bias, seeds, rate, eps, rows):
    n, d = x2.shape
    seeds_spec, block, vector, _ = _specs(rows, d)
    kernel = functools.partial(_forward_kernel, rate=rate, eps=eps)
    out, z = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((n, d), x2.dtype),
            jax.ShapeDtypeStruct((n, d), x2.dtype),
        ),
        grid=(n // rows,),
        in_specs=[seeds_spec, block, block, vector, vector],
        out_specs=(block, block),
        interpret=_interpret(),
        compiler_params=_compiler_params(),
        name="dropout_add_layer_norm_fwd",
    )(seeds, x2, y2, scale.reshape(1, d), bias.reshape(1, d))
    return out, z


def _backward(z, g, scale, seeds, rate, eps, rows, steps):
    n, d = z.shape
    seeds_spec, block, vector, partial = _specs(rows * steps, d)
    kernel = functools.partial(_backward_kernel, rate=rate, eps=eps, rows=rows)
    blocks = n // (rows * steps)
    return pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((n, d), z.dtype),  # dx
            jax.ShapeDtypeStruct((n, d), z.dtype),  # dy (x, y and z share a dtype)
            jax.ShapeDtypeStruct((blocks, d), jnp.float32),
            jax.ShapeDtypeStruct((blocks, d), jnp.float32),
        ),
        grid=(blocks,),
        in_specs=[seeds_spec, block, block, vector],
        out_specs=(block, block, partial, partial),
        interpret=_interpret(),
        compiler_params=_compiler_params(),
        name="dropout_add_layer_norm_bwd",
    )(seeds, z, g, scale.reshape(1, d))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _fused(x2, y2, scale, bias, seeds, rate, eps, rows, steps):
    return _forward(x2, y2, scale, bias, seeds, rate, eps, rows)[0]


def _fused_fwd(x2, y2, scale, bias, seeds, rate, eps, rows, steps):
    out, z = _forward(x2, y2, scale, bias, seeds, rate, eps, rows)
    return out, (z, scale, bias, seeds)


def _fused_bwd(rate, eps, rows, steps, residuals, g):
    z, scale, bias, seeds = residuals
    dx, dy, dscale, dbias = _backward(z, g, scale, seeds, rate, eps, rows, steps)
    dscale = jnp.sum(dscale, axis=0).astype(scale.dtype)
    dbias = jnp.sum(dbias, axis=0).astype(bias.dtype)
    return dx, dy, dscale, dbias, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def dropout_add_layer_norm(
    x: Float[Array, "*B D"],
    y: Float[Array, "*Y"],  # checked below, with a message that says what differs
    scale: Float[Array, " S"],
    bias: Float[Array, " T"],
    seeds: Array | None = None,
    *,
    rate: float | Array = 0.0,  # an Array is refused below, with the reason
    eps: float = 1e-6,
    block_rows: int | None = None,
) -> Float[Array, "*B D"]:
    """LayerNorm(x + dropout(y)) in one kernel each way (the post-LN residual step).

    Args:
      x: the residual stream [..., D]; y: the sub-layer's output, same shape and dtype.
      scale, bias: the norm's [D] parameters.
      seeds: [2] uint32 from `make_seeds` (needed when rate > 0).
      rate: the dropout rate, a Python float in [0, 1) (0: no dropout).
      eps: the norm's epsilon.
      block_rows: rows per program (a power of two; default: TFJAX_FUSED_ELEMENTS // D).

    Returns:
      The normalised sum, x's shape and dtype. Gradients flow to x, y, scale and bias.

    Raises:
      ValueError: for mismatched shapes or dtypes, a traced or out-of-range rate, a missing
        seed, or (on a GPU) a width that is not a power of two.
    """
    if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(f"x and y must match: x {x.shape} {x.dtype}, y {y.shape} {y.dtype}")
    d = x.shape[-1]
    if scale.shape != (d,) or bias.shape != (d,):
        raise ValueError(f"scale {scale.shape} and bias {bias.shape} must be ({d},)")
    if not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
        raise ValueError(
            f"rate must be a Python float in [0, 1), got {rate!r} (a traced rate, as in "
            "vectorised sweeps, needs residual_impl='xla')"
        )
    if rate > 0 and seeds is None:
        raise ValueError("seeds are required when rate > 0 (tfjax.nn.fused.make_seeds)")
    if not _interpret() and d & (d - 1):
        raise ValueError(
            f"the Triton kernel needs a power-of-two width, got D={d}; use residual_impl='xla'"
        )
    if seeds is None:
        seeds = jnp.zeros((2,), jnp.uint32)
    x2 = x.reshape(-1, d)
    y2 = y.reshape(-1, d)
    n = x2.shape[0]
    rows = block_rows or _block_rows(d)
    if rows & (rows - 1):
        raise ValueError(f"block_rows must be a power of two, got {rows}")
    steps = max(1, min(_setting("STEPS"), -(-n // rows)))  # backward chunks per program
    padded = -n % (rows * steps)
    if padded:  # whole blocks only; the padded rows are dropped from the output
        x2 = jnp.pad(x2, ((0, padded), (0, 0)))
        y2 = jnp.pad(y2, ((0, padded), (0, 0)))
    seeds = seeds.astype(jnp.uint32)
    out = _fused(x2, y2, scale, bias, seeds, float(rate), float(eps), rows, steps)
    return out[:n].reshape(x.shape)
