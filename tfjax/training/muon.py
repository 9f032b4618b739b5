"""Muon for the hidden weight matrices, on optax's `optax.contrib.scale_by_muon`.

Source: K. Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"
(kellerjordan.github.io/posts/muon). For a weight matrix W (fan-in x fan-out) with gradient G,
optax computes Nesterov momentum with Adam's bias correction at step t,

    M <- beta M + (1 - beta) G
    U <- beta M / (1 - beta^(t+1)) + (1 - beta) G / (1 - beta^t)
    O <- NewtonSchulz5(U)  ~ the orthogonal factor of U's polar decomposition
    W <- W - lr * sqrt(max(1, fan_out / fan_in)) * O      (`scale_by_width`)

with Jordan's quintic coefficients (3.4445, -4.7750, 2.0315), five steps, U normalised to
Frobenius norm 1 (+ `NS_EPS`). The bias correction is the one difference from the original
(which uses M and G unscaled): it changes the direction of the first few updates only, since
the Newton-Schulz input is normalised and both factors tend to 1 (the comparison of the two:
docs/training.md, "Muon"). optax's state (count, mu, ns_coeffs) differs from the former
hand-written one's (momentum only); checkpoints written before are converted as they are read
(`from_legacy_state`).

Only the hidden layers' matrices take Muon (`muon_dimensions`); embeddings, output and
classification layers, biases and norm scales keep Adam (`tfjax.training.optim`,
optimizer="muon"). tfjax's kernels are not all 2-D: attention projections are
[D, heads, head_dim] ("qkv", "query", "key", "value", "kv", "value_up") or [heads, head_dim, D]
("out"), and scanned stacks put a layer axis first. `muon_dimensions` gives each kernel optax's
`MuonDimensionNumbers`: the fan-in axes are the reduction axes, the others after the layer axes
the output axes, and each layer's matrix (optax's batch axes) is orthogonalised alone.
"""

import logging
import math
from collections.abc import Collection
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import contrib

MuonDimensionNumbers = contrib.MuonDimensionNumbers
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7  # added to the Frobenius norm before Newton-Schulz (optax's default: 1e-8)

log = logging.getLogger(__name__)

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


def path_names(path) -> list[str | None]:
    """The names along a pytree key path (dict keys, attribute names; None for indices)."""
    return [getattr(k, "key", getattr(k, "name", None)) for k in path]


def _dimensions(path, leaf) -> MuonDimensionNumbers | None:
    names = path_names(path)
    if len(names) < 3 or names[-1] != "kernel":
        return None
    module, parent = names[-2], names[-3]
    if isinstance(parent, str) and parent.endswith("attention") and module in _ATTENTION_KERNELS:
        ndim, fan_in = _ATTENTION_KERNELS[module]
    elif parent == "mlp" and module in _MLP_KERNELS:
        ndim, fan_in = _MLP_KERNELS[module]
    else:
        return None
    extra = leaf.ndim - ndim  # leading layer axes of scanned stacks
    if extra < 0:
        return None
    reduction = tuple(a + extra for a in fan_in)
    output = tuple(a for a in range(extra, leaf.ndim) if a not in reduction)
    return MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)


def muon_dimensions(params):
    """A tree like `params`: optax's `MuonDimensionNumbers` (fan-in axes as reduction axes,
    fan-out axes as output axes, layer axes left as batch axes) for the hidden layers' kernels
    (attention projections and feed-forward layers, under modules named "*attention" and
    "mlp"), None elsewhere. Leaves that are not arrays (optax's masked-out nodes) stay."""
    return jax.tree_util.tree_map_with_path(_dimensions, params)


def muon_mask(params):
    """True where `muon_dimensions` gives dimension numbers: the leaves that take Muon."""
    return jax.tree_util.tree_map_with_path(lambda p, x: _dimensions(p, x) is not None, params)


def scale_by_muon(beta: float = 0.95) -> optax.GradientTransformation:
    """Muon's direction (optax's Nesterov momentum `beta`, orthogonalised, scaled by
    sqrt(max(1, fan_out / fan_in))) for the leaves `muon_dimensions` names. Apply it under
    `optax.masked(..., muon_mask)`, as `tfjax.training.optim` does: optax needs dimension
    numbers for every leaf it sees."""
    return optax.chain(
        contrib.scale_by_muon(
            ns_coeffs=NS_COEFFS,
            ns_steps=NS_STEPS,
            beta=beta,
            eps=NS_EPS,
            nesterov=True,
            weight_dimension_numbers=muon_dimensions,
        ),
        scale_by_width(),
    )


def scale_by_width() -> optax.GradientTransformation:
    """Scales each Muon kernel's update by sqrt(max(1, fan_out / fan_in)) (Jordan's width
    rule, as `optax.contrib.muon` does; optax keeps its transform for it private)."""

    def scale(path, update):
        dims = _dimensions(path, update)
        if dims is None:
            return update
        fan_in = math.prod(update.shape[a] for a in dims.reduction_axis)
        fan_out = math.prod(update.shape[a] for a in dims.output_axis)
        return update * math.sqrt(max(1.0, fan_out / fan_in))

    def update_fn(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(scale, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


class LegacyMuonState(NamedTuple):
    """The state of tfjax's former hand-written Muon transformation: its momentum buffer only
    (a tree like the params, optax's masked-out nodes where Adam takes over)."""

    momentum: optax.Updates


def has_legacy_state(saved_keys: Collection[str]) -> bool:
    """Whether a checkpoint's state, given by the key paths of its arrays (the `checksums`
    item's keys), holds the former Muon state: only it had a field named `momentum`."""
    return any(".momentum" in key for key in saved_keys)


def _is_muon_chain(node: Any) -> bool:
    """The state of `scale_by_muon`'s chain: (optax's MuonState, scale_by_width's EmptyState)."""
    return (
        isinstance(node, tuple)
        and len(node) == 2
        and isinstance(node[0], contrib.MuonState)
        and isinstance(node[1], optax.EmptyState)
    )


def _is_legacy_matrices(node: Any) -> bool:
    """The state of `tfjax.training.optim`'s Muon chain as the former Muon left it:
    (LegacyMuonState, add_decayed_weights' EmptyState, scale_by_learning_rate's state)."""
    return isinstance(node, tuple) and len(node) == 3 and isinstance(node[0], LegacyMuonState)


def to_legacy_state(state: Any) -> Any:
    """`state` (a train state, or any tree holding Muon states) with each `scale_by_muon`
    state in the former layout, `LegacyMuonState(momentum=mu)`: the tree an old checkpoint is
    restored into (run on an abstract state under `jax.eval_shape`)."""

    def convert(node):
        return LegacyMuonState(momentum=node[0].mu) if _is_muon_chain(node) else node

    return jax.tree.map(convert, state, is_leaf=_is_muon_chain)


def from_legacy_state(state: Any) -> Any:
    """`state` restored from a checkpoint of the former hand-written Muon, in optax's layout.

    Kept so that workdirs written before Muon moved onto `optax.contrib.scale_by_muon` still
    resume. Both momentum buffers are the same exponential average, M <- beta M + (1 - beta) G
    (optax applies its bias correction to M when it uses it, not to the buffer), so the old
    `momentum` becomes `mu` unchanged. optax's `count` (updates applied, for the bias
    correction) is the count of the learning-rate schedule beside it in the same chain, which
    also advanced once per applied update; `ns_coeffs` are `NS_COEFFS`, as `scale_by_muon`
    sets them. The Adam part is left as it is.
    """

    def convert(node):
        if not _is_legacy_matrices(node):
            return node
        legacy, decay, schedule = node
        # A copy: the same buffer twice in the state would be donated twice by the train step.
        count = jnp.array(schedule.count, jnp.int32, copy=True)
        coeffs = jnp.asarray(NS_COEFFS)
        if isinstance(count, jax.Array):  # placed as the count is (replicated on the mesh)
            coeffs = jax.device_put(coeffs, count.sharding)
        new = contrib.MuonState(count=count, mu=legacy.momentum, ns_coeffs=coeffs)
        return ((new, optax.EmptyState()), decay, schedule)

    converted = jax.tree.map(convert, state, is_leaf=_is_legacy_matrices)
    log.info("converted the former Muon optimizer state (momentum) to optax's Muon state")
    return converted
