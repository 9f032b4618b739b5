"""The matmul behind every dense layer, with a backward pass laid out for XLA's CPU backend.

`dense_dot_general` is a drop-in `dot_general` for `flax.linen.Dense` / `DenseGeneral`
(`dot_general=` attribute). For the dense case (contract the last axes of x with the first axes
of the kernel, no batch axes) it computes x [M, I] · W [I, O] with a hand-written backward:

    dx = dy · (W^T)
    dW = (x^T) · dy          when I <= O
    dW = ((dy^T) · x)^T      when I > O

where every transposed operand and the [O, I] product are materialised first
(`lax.optimization_barrier`), so that each product is a plain row-major matmul for XLA's fast
CPU kernels and each transpose is a copy of the smaller of the two [M, *] operands. Autodiff
gives the same products, but XLA's CPU backend then transposes dy itself inside fusions that
recompute dy's producers (layer-norm backward, dropout), and runs dx as a slower
transposed-operand matmul. For the feed-forward output layer (I = 4 O) transposing x costs 12
ms a layer on the benchmark host (x^T is [1024, 2048]); dy^T is a quarter of that. If XLA is
left to fold the final transpose into the matmul it picks a slow transposed-operand kernel.

Measured on the benchmark train step (`experiments.bench` shape), in-process paired A/B:
autodiff -> x^T always: step-time ratio 1.11 (12 pairs, 1.03-1.22) on a 2-core AVX2 host;
x^T always -> smaller transpose: 1.044 and 1.042 (2 x 16 pairs) on a 2-core AMD EPYC host.
Any other contraction goes to `lax.dot_general`.

The layout above is for XLA's CPU backend only (`lax.platform_dependent`, resolved when the
step is lowered): on GPU and TPU the backward is autodiff's `dy · W^T` and `x^T · dy`, because
their matmul libraries read transposed operands in place, and a materialised transpose would only
add a pass over memory (and the barriers would keep XLA from fusing around the products).
"""

import math

import jax
from jaxtyping import Array, Float


@jax.custom_jvp
def matmul(x: Float[Array, "M I"], w: Float[Array, "I O"]) -> Float[Array, "M O"]:
    """x · w with the backward pass of the module docstring; forward mode works too."""
    return x @ w


# `matmul` is a custom_jvp, not a custom_vjp, so that forward mode (`jax.jvp`, `jax.jacfwd`,
# `jax.hessian`, Hessian-vector products) works. Its tangent map is written with the
# materialised transposes of the backward pass above, arranged so that JAX's own transpose of
# that linear map is exactly that backward: the transpose of `dx · (W^T)^T` is `dy · W^T`, and
# `optimization_barrier` and `.T` transpose to themselves. The compiled train step is the same
# program as with the former hand-written custom_vjp (tests/test_linear.py compares them).


def _tangent_cpu(x, w, dx, dw):
    """d(x · w) for XLA:CPU, laid out so that its transpose is the module docstring's backward."""
    contract_last = (((1,), (1,)), ((), ()))
    w_t = jax.lax.optimization_barrier(w.T)  # [O, I], materialised
    out = jax.lax.dot_general(dx, w_t, contract_last)  # dx · w; transposes to dy · w_t
    if x.shape[1] > w.shape[1]:  # I > O: the backward transposes dy [M, O], the smaller operand
        dw_t = jax.lax.optimization_barrier(dw.T)  # [O, I]
        product = jax.lax.dot_general(dw_t, x, contract_last)  # [O, M]; transposes to dy_t · x
        return out + jax.lax.optimization_barrier(product).T
    x_t = jax.lax.optimization_barrier(x.T)  # [I, M], materialised
    return out + jax.lax.dot_general(x_t, dw, (((0,), (0,)), ((), ())))  # transposes to x_t · dy


def _tangent_default(x, w, dx, dw):
    """Autodiff's products: GPU and TPU matmuls read transposed operands at no cost."""
    return dx @ w + x @ dw


@matmul.defjvp
def _matmul_jvp(primals, tangents):
    x, w = primals
    dx, dw = tangents
    tangent = jax.lax.platform_dependent(x, w, dx, dw, cpu=_tangent_cpu, default=_tangent_default)
    return x @ w, tangent


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
    """`lax.dot_general` with `matmul`'s backward for dense layers (module docstring)."""
    if precision is not None or preferred_element_type is not None:
        return jax.lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
        )
    if not _is_dense(lhs, rhs, dimension_numbers):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers)
    n = len(dimension_numbers[0][0])
    batch_shape, out_shape = lhs.shape[: lhs.ndim - n], rhs.shape[n:]
    inner = math.prod(lhs.shape[lhs.ndim - n :])
    out = matmul(lhs.reshape(-1, inner), rhs.reshape(inner, -1))  # [M, O]
    return out.reshape(*batch_shape, *out_shape)
