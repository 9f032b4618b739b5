"""tfjax.nn.linear: the dense matmul with a hand-written backward equals autodiff of a plain one."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import linear


def test_matmul_gradients_on_literal_matrices():
    x = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # [M=3, I=2]
    w = jnp.array([[1.0, 0.0, -1.0], [2.0, 1.0, 0.5]])  # [I=2, O=3]
    dy = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    y, vjp = jax.vjp(linear.matmul, x, w)
    dx, dw = vjp(dy)
    # y = x w; dx = dy w^T; dw = x^T dy, written out element by element.
    np.testing.assert_allclose(y, [[5.0, 2.0, 0.0], [11.0, 4.0, -1.0], [17.0, 6.0, -2.0]])
    np.testing.assert_allclose(dx, [[1.0, 2.0], [0.0, 1.0], [-2.0, 1.0]])
    np.testing.assert_allclose(dw, [[1.0, 3.0, 10.0], [2.0, 4.0, 12.0]])


# I > O and I <= O take different backward paths (which operand is transposed).
@pytest.mark.parametrize("m, i, o", [(6, 5, 4), (6, 4, 5), (3, 8, 8), (1, 16, 2)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_vjp_equals_autodiff_of_a_plain_matmul(dtype, m, i, o):
    kx, kw, kd = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (m, i), dtype)
    w = jax.random.normal(kw, (i, o), dtype)
    dy = jax.random.normal(kd, (m, o), dtype)
    got = jax.vjp(linear.matmul, x, w)[1](dy)
    want = jax.vjp(jnp.matmul, x, w)[1](dy)
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "features, axis", [(7, -1), ((3, 2), -1), (7, (-2, -1)), ((2, 3), (-2, -1))]
)
def test_dense_general_with_it_matches_flax_default(features, axis):
    x = jax.random.normal(jax.random.key(1), (2, 5, 4, 3))
    plain = nn.DenseGeneral(features, axis=axis)
    ours = nn.DenseGeneral(features, axis=axis, dot_general=linear.dense_dot_general)
    params = plain.init(jax.random.key(2), x)

    def loss(module, params, x):
        return jnp.sum(jnp.sin(module.apply(params, x)))

    got = jax.value_and_grad(loss, argnums=(1, 2))(ours, params, x)
    want = jax.value_and_grad(loss, argnums=(1, 2))(plain, params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_other_contractions_fall_back_to_lax_dot_general():
    lhs = jax.random.normal(jax.random.key(3), (2, 3, 4))
    rhs = jax.random.normal(jax.random.key(4), (2, 4, 5))
    dims = (((2,), (1,)), ((0,), (0,)))  # batched: not a dense layer
    np.testing.assert_allclose(
        linear.dense_dot_general(lhs, rhs, dims), jax.lax.dot_general(lhs, rhs, dims), rtol=1e-6
    )
    first_axis = (((0,), (0,)), ((), ()))  # contracts lhs's first axis, not its last
    a, b = (
        jax.random.normal(jax.random.key(5), (4, 3)),
        jax.random.normal(jax.random.key(6), (4, 2)),
    )
    np.testing.assert_allclose(
        linear.dense_dot_general(a, b, first_axis),
        jax.lax.dot_general(a, b, first_axis),
        rtol=1e-6,
    )


@pytest.mark.parametrize("m, i, o", [(6, 5, 4), (6, 4, 5)])
@pytest.mark.parametrize("branch", ["_tangent_cpu", "_tangent_default"])
def test_each_platform_tangent_and_its_transpose_equal_autodiff(branch, m, i, o):
    # Both branches are called directly, so the GPU/TPU one is checked on this CPU too.
    kx, kw, kdx, kdw, kd = jax.random.split(jax.random.key(7), 5)
    x, w = jax.random.normal(kx, (m, i)), jax.random.normal(kw, (i, o))
    dx, dw = jax.random.normal(kdx, (m, i)), jax.random.normal(kdw, (i, o))
    dy = jax.random.normal(kd, (m, o))
    tangent = functools.partial(getattr(linear, branch), x, w)
    np.testing.assert_allclose(tangent(dx, dw), dx @ w + x @ dw, rtol=1e-5, atol=1e-5)
    got = jax.linear_transpose(tangent, dx, dw)(dy)
    want = jax.vjp(jnp.matmul, x, w)[1](dy)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m, i, o", [(6, 5, 4), (6, 4, 5)])
def test_forward_mode_through_matmul_equals_plain_autodiff(m, i, o):
    kx, kw, kv = jax.random.split(jax.random.key(8), 3)
    x, w = jax.random.normal(kx, (m, i)), jax.random.normal(kw, (i, o))
    v = jax.random.normal(kv, (i, o))

    def loss(matmul, w):
        return jnp.sum(jnp.tanh(matmul(x, w)) ** 2)

    ours, plain = functools.partial(loss, linear.matmul), functools.partial(loss, jnp.matmul)
    for a, b in zip(jax.jvp(ours, (w,), (v,)), jax.jvp(plain, (w,), (v,)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(ours)(w), jax.jacfwd(plain)(w), rtol=1e-5, atol=1e-5)
    # Hessian-vector products, forward over reverse and reverse over forward.
    hvp = jax.jvp(jax.grad(plain), (w,), (v,))[1]
    np.testing.assert_allclose(jax.jvp(jax.grad(ours), (w,), (v,))[1], hvp, rtol=1e-4, atol=1e-5)
    rev = jax.grad(lambda w: jax.jvp(ours, (w,), (v,))[1])(w)
    np.testing.assert_allclose(rev, hvp, rtol=1e-4, atol=1e-5)


def test_hessian_vector_product_of_a_dense_model_equals_flax_default():
    x = jax.random.normal(jax.random.key(9), (4, 6))
    plain = nn.Sequential([nn.Dense(5), nn.tanh, nn.Dense(3)])
    ours = nn.Sequential(
        [
            nn.Dense(5, dot_general=linear.dense_dot_general),
            nn.tanh,
            nn.Dense(3, dot_general=linear.dense_dot_general),
        ]
    )
    params = plain.init(jax.random.key(10), x)
    vector = jax.tree.map(
        lambda p: jnp.cos(jnp.arange(p.size, dtype=p.dtype)).reshape(p.shape), params
    )

    def hvp(module):
        grad = jax.grad(lambda p: jnp.sum(module.apply(p, x) ** 2))
        return jax.jvp(grad, (params,), (vector,))[1]

    for a, b in zip(jax.tree.leaves(hvp(ours)), jax.tree.leaves(hvp(plain)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _reference_bwd_cpu(x, w, dy):
    """The CPU backward written out: materialised W^T, and x^T or dy^T, whichever is smaller."""
    barrier = jax.lax.optimization_barrier
    dx = dy @ barrier(w.T)
    if x.shape[1] > dy.shape[1]:
        return dx, barrier(barrier(dy.T) @ x).T
    return dx, barrier(x.T) @ dy


@jax.custom_vjp
def _reference_matmul(x, w):
    return x @ w


_reference_matmul.defvjp(lambda x, w: (x @ w, (x, w)), lambda r, dy: _reference_bwd_cpu(*r, dy))


def _optimised_ops(fn, *args):
    """The compiled program's instructions with names and metadata stripped."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    lines = [line for line in text.splitlines() if " = " in line and not line[:1].isdigit()]
    noise = r", metadata=\{[^}]*\}|%[\w.\-]+|stack_frame_id=\d+"
    return [re.sub(noise, "", line) for line in lines]


@pytest.mark.parametrize("m, i, o", [(32, 48, 16), (32, 16, 48)])
def test_cpu_gradient_is_the_hand_written_backward(m, i, o):
    # The custom_jvp's tangent is arranged so that JAX's transpose of it is the backward of the
    # module docstring: the compiled gradient program is the same as with that backward written
    # out as a custom_vjp (the layout is what makes it fast on XLA:CPU).
    def loss(matmul, x, w1, w2):
        return jnp.sum(jnp.sin(matmul(jnp.tanh(matmul(x, w1)), w2)))

    args = (jnp.ones((m, i)), jnp.ones((i, o)) / i, jnp.ones((o, i)) / o)

    def grads(matmul):
        return jax.grad(functools.partial(loss, matmul), argnums=(0, 1, 2))

    ours = _optimised_ops(grads(linear.matmul), *args)
    assert ours == _optimised_ops(grads(_reference_matmul), *args)
    assert ours != _optimised_ops(grads(jnp.matmul), *args)  # the layout is not autodiff's


def _matmul_grads(x, w):
    return jax.grad(lambda x, w: jnp.sum(linear.matmul(x, w) ** 2), argnums=(0, 1))(x, w)


@pytest.mark.parametrize("platform, barriers", [("cpu", True), ("cuda", False), ("tpu", False)])
def test_transpose_barriers_only_in_the_cpu_lowering(platform, barriers):
    # jax.export lowers for a platform this host lacks: the choice is made at lowering time.
    args = (jax.ShapeDtypeStruct((8, 6), jnp.float32), jax.ShapeDtypeStruct((6, 4), jnp.float32))
    text = jax.export.export(jax.jit(_matmul_grads), platforms=[platform])(*args).mlir_module()
    assert ("optimization_barrier" in text) == barriers


def test_cpu_compilation_keeps_no_platform_switch():
    x, w = jnp.ones((8, 6)), jnp.ones((6, 4))
    hlo = jax.jit(_matmul_grads).lower(x, w).compile().as_text()
    assert "conditional" not in hlo
