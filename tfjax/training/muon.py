"""Muon: momentum whose update is orthogonalised, for the hidden weight matrices.

Source: K. Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"
(kellerjordan.github.io/posts/muon). For a weight matrix W (fan-in x fan-out) with gradient G:

    M <- beta M + (1 - beta) G                       (momentum, an exponential average)
    U <- beta M + (1 - beta) G                       (Nesterov: the average one step ahead)
    O <- NewtonSchulz5(U) ~ the orthogonal factor of U's polar decomposition (U = O P)
    W <- W - lr * sqrt(max(1, fan_out / fan_in)) * O

NewtonSchulz5 normalises U to Frobenius norm 1 and applies X <- a X + (b A + c A^2) X with
A = X X^T five times, (a, b, c) = (3.4445, -4.7750, 2.0315): an odd quintic that pushes every
singular value towards 1 (to about 0.7-1.2, which is what the optimiser needs), with X the wide
orientation of U so that A is the smaller Gram matrix. Only the hidden layers' matrices take
Muon (`muon_dimensions`); embeddings, output and classification layers, biases and norm
scales keep Adam (`tfjax.training.optim`, optimizer="muon").

tfjax's kernels are not all 2-D: attention projections are [D, heads, head_dim] ("qkv",
"query", "key", "value", "kv", "value_up") or [heads, head_dim, D] ("out"), and scanned stacks
put a layer axis first. `muon_dimensions` says, per kernel, which axes are the fan-in; the
others after the layer axis are the fan-out, and each layer's matrix is orthogonalised alone.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5

# Kernels that take Muon: (parent module names it may sit in, its module name) -> (the
# kernel's number of axes in an unscanned layer, its fan-in axes).
_ATTENTION_KERNELS = {
    "qkv": (3, (0,)),
    "query": (3, (0,)),
    "key": (3, (0,)),
    "value": (3, (0,)),
    "kv": (3, (0,)),
    "value_up": (3, (0,)),
    "value_down": (2, (0,)),
    "out": (3, (0, 1)),
}
_MLP_KERNELS = {"wi": (2, (0,)), "wi_gate": (2, (0,)), "wo": (2, (0,))}


class MatrixAxes(NamedTuple):
    """How a kernel is a stack of matrices: `batch` axes (scanned layers), `fan_in`, the rest
    fan-out (all as axis numbers of the kernel)."""

    batch: tuple[int, ...]
    fan_in: tuple[int, ...]


def path_names(path) -> list[str | None]:
    """The names along a pytree key path (dict keys, attribute names; None for indices)."""
    return [getattr(k, "key", getattr(k, "name", None)) for k in path]


def _axes(path, leaf) -> MatrixAxes | None:
    names = path_names(path)
    if len(names) < 3 or names[-1] != "kernel":
        return None
    module, parent = names[-2], names[-3]
    if parent.endswith("attention") and module in _ATTENTION_KERNELS:
        ndim, fan_in = _ATTENTION_KERNELS[module]
    elif parent == "mlp" and module in _MLP_KERNELS:
        ndim, fan_in = _MLP_KERNELS[module]
    else:
        return None
    extra = leaf.ndim - ndim  # leading layer axes of scanned stacks
    if extra < 0:
        return None
    return MatrixAxes(batch=tuple(range(extra)), fan_in=tuple(a + extra for a in fan_in))


def muon_dimensions(params):
    """A tree like `params`: `MatrixAxes` for the hidden layers' kernels (attention projections
    and feed-forward layers, under modules named "*attention" and "mlp"), None elsewhere."""
    return jax.tree_util.tree_map_with_path(_axes, params)


def muon_mask(params):
    """True where `muon_dimensions` gives axes: the leaves that take Muon."""
    return jax.tree_util.tree_map_with_path(lambda p, x: _axes(p, x) is not None, params)


def newton_schulz(u: jax.Array, steps: int = NS_STEPS) -> jax.Array:
    """The approximate orthogonal factor of each matrix in `u` [..., m, n], in float32."""
    x = u.astype(jnp.float32)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = jnp.swapaxes(x, -1, -2)
    x = x / (jnp.sqrt(jnp.sum(x * x, axis=(-2, -1), keepdims=True)) + 1e-7)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return jnp.swapaxes(x, -1, -2) if tall else x


def orthogonalize(update: jax.Array, axes: MatrixAxes, steps: int = NS_STEPS) -> jax.Array:
    """Muon's direction for one kernel: each matrix (fan-in x fan-out, per batch index)
    orthogonalised and scaled by sqrt(max(1, fan_out / fan_in)); same shape as `update`."""
    fan_out_axes = tuple(
        a for a in range(update.ndim) if a not in axes.batch and a not in axes.fan_in
    )
    order = axes.batch + axes.fan_in + fan_out_axes
    moved = jnp.transpose(update, order)
    batch_shape = moved.shape[: len(axes.batch)]
    fan_in = math.prod(update.shape[a] for a in axes.fan_in)
    fan_out = math.prod(update.shape[a] for a in fan_out_axes)
    ortho = newton_schulz(moved.reshape(*batch_shape, fan_in, fan_out), steps)
    ortho = ortho * math.sqrt(max(1.0, fan_out / fan_in))
    back = tuple(order.index(a) for a in range(update.ndim))
    return jnp.transpose(ortho.reshape(moved.shape), back).astype(update.dtype)


class MuonState(NamedTuple):
    momentum: optax.Updates


def scale_by_muon(beta: float = 0.95, steps: int = NS_STEPS) -> optax.GradientTransformation:
    """Muon's direction (Nesterov momentum `beta`, orthogonalised) for every leaf that
    `muon_dimensions` names; other leaves pass through unchanged (mask them out with
    `optax.masked`, as `tfjax.training.optim` does)."""

    def init(params):
        return MuonState(momentum=jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        momentum = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, state.momentum, updates)
        ahead = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, momentum, updates)

        def direction_of(path, u):
            axes = _axes(path, u)
            return u if axes is None else orthogonalize(u, axes, steps)

        direction = jax.tree_util.tree_map_with_path(direction_of, ahead)
        return direction, MuonState(momentum=momentum)

    return optax.GradientTransformation(init, update)
