"""The matmul behind every dense layer: one 2-D product, whatever the layer's axes.

`dense_dot_general` is a drop-in `dot_general` for `flax.linen.Dense` / `DenseGeneral`
(`dot_general=` attribute). For the dense case (contract the last axes of x with the first axes
of the kernel, no batch axes) it flattens x to [M, I] and the kernel to [I, O], multiplies, and
reshapes the [M, O] product back; its gradient is autodiff's. Any other contraction, and any
call with an explicit `precision` or `preferred_element_type`, goes to `lax.dot_general`.
`tied_projection` is the same for the tied output layer: x [..., E] times the [V, E] embedding
table, transposed inside the one [M, E] x [V, E]^T product.

Why: XLA's CPU backend runs the flattened product (and its two backward products) faster than
the same contraction left with its [B, L, ...] axes; GPU and TPU matmul libraries take either
form and get the same flattened product. The stock call is `lax.dot_general`, Flax's default
`dot_general`: a layer built without `dot_general=dense_dot_general` runs it. Measurements:
docs/performance.md, "Measurements behind the fast paths".
"""

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array


def _is_dense(lhs: Array, rhs: Array, dimension_numbers) -> bool:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    n = len(lhs_contract)
    return (
        not lhs_batch
        and not rhs_batch
        and tuple(lhs_contract) == tuple(range(lhs.ndim - n, lhs.ndim))
        and tuple(rhs_contract) == tuple(range(n))
        and lhs.dtype == rhs.dtype
        and lhs.size > 0
        and rhs.size > 0
    )


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`lax.dot_general`, computed as one [M, I] x [I, O] product for dense layers."""
    if precision is not None or preferred_element_type is not None:
        return jax.lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
        )
    if not _is_dense(lhs, rhs, dimension_numbers):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers)
    n = len(dimension_numbers[0][0])
    batch_shape, out_shape = lhs.shape[: lhs.ndim - n], rhs.shape[n:]
    inner = math.prod(lhs.shape[lhs.ndim - n :])
    out = lhs.reshape(-1, inner) @ rhs.reshape(inner, -1)  # [M, O]
    return out.reshape(*batch_shape, *out_shape)


def tied_projection(x: Array, table: Array, *, fast_path: bool = True) -> Array:
    """Logits [..., V] = x [..., E] · table[V, E]^T, as one [M, E] x [V, E]^T product.

    Flattened for the reason the dense layers are; `fast_path=False` runs the stock einsum
    `jnp.einsum("...e,ve->...v", x, table)` instead.
    """
    if not fast_path:
        return jnp.einsum("...e,ve->...v", x, table)
    product = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), table, (((1,), (1,)), ((), ())))
    return product.reshape(*x.shape[:-1], table.shape[0])
