"""tfjax.nn.linear: dense layers computed as one 2-D product equal Flax's own dot_general."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax.nn import linear


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


def _dot_operand_ranks(fn, *args):
    """The operand ranks of every dot_general in fn's jaxpr (forward and backward)."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [
        tuple(v.aval.ndim for v in eqn.invars)
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "dot_general"
    ]


@pytest.mark.parametrize("features, axis", [(7, -1), ((2, 3), (-2, -1))])
def test_dense_layers_multiply_flattened_2d_operands_forward_and_backward(features, axis):
    # The point of the module: every product of a dense layer, and of its gradient, is a plain
    # [M, I] x [I, O] matmul (Flax's default keeps the [B, L, ...] axes: rank-4 operands here).
    x = jax.random.normal(jax.random.key(1), (2, 5, 4, 3))
    module = nn.DenseGeneral(features, axis=axis, dot_general=linear.dense_dot_general)
    params = module.init(jax.random.key(2), x)

    def loss(params, x):
        return jnp.sum(jnp.sin(module.apply(params, x)))

    ranks = _dot_operand_ranks(jax.grad(loss, argnums=(0, 1)), params, x)
    assert len(ranks) == 3 and all(r == (2, 2) for r in ranks), ranks
    plain = nn.DenseGeneral(features, axis=axis)
    plain_ranks = _dot_operand_ranks(
        jax.grad(lambda p, x: jnp.sum(jnp.sin(plain.apply(p, x))), argnums=(0, 1)), params, x
    )
    assert any(r != (2, 2) for r in plain_ranks), plain_ranks


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


def test_tied_projection_equals_the_einsum_and_multiplies_2d_operands():
    x = jax.random.normal(jax.random.key(11), (2, 5, 4))
    table = jax.random.normal(jax.random.key(12), (7, 4))
    weights = jax.random.normal(jax.random.key(13), (2, 5, 7))  # no symmetry in V to hide behind

    def loss(project, x, table):
        return jnp.sum(weights * jnp.sin(project(x, table)))

    def reference(x, table):  # logits[b, l, v] = sum_e x[b, l, e] * table[v, e]
        return jnp.einsum("ble,ve->blv", x, table)

    got = jax.value_and_grad(loss, argnums=(1, 2))(linear.tied_projection, x, table)
    want = jax.value_and_grad(loss, argnums=(1, 2))(reference, x, table)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert linear.tied_projection(x, table).shape == (2, 5, 7)
    grad = jax.grad(lambda x, t: loss(linear.tied_projection, x, t), argnums=(0, 1))
    ranks = _dot_operand_ranks(grad, x, table)
    assert len(ranks) == 3 and all(r == (2, 2) for r in ranks), ranks


def test_tied_projection_stock_path_is_the_einsum():
    x = jax.random.normal(jax.random.key(21), (2, 3, 4))
    table = jax.random.normal(jax.random.key(22), (5, 4))
    stock = jax.make_jaxpr(lambda a, b: linear.tied_projection(a, b, fast_path=False))(x, table)
    want = jax.make_jaxpr(lambda a, b: jnp.einsum("...e,ve->...v", a, b))(x, table)
    assert str(stock) == str(want)
    np.testing.assert_allclose(
        linear.tied_projection(x, table),
        linear.tied_projection(x, table, fast_path=False),
        rtol=1e-5,
        atol=1e-6,
    )
