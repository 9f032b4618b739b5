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
docs/training.md, "Muon").

Only the hidden layers' matrices take Muon (`muon_dimensions`); embeddings, output and
classification layers, biases and norm scales keep Adam (`tfjax.training.optim`,
optimizer="muon"). tfjax's kernels are not all 2-D: attention projections are
[D, heads, head_dim] ("qkv", "query", "key", "value", "kv", "value_up") or [heads, head_dim, D]
("out"), and scanned stacks put a layer axis first. `muon_dimensions` gives each kernel optax's
`MuonDimensionNumbers`: the fan-in axes are the reduction axes, the others after the layer axes
the output axes, and each layer's matrix (optax's batch axes) is orthogonalised alone.
"""

import math

import jax
import optax
from optax import contrib

MuonDimensionNumbers = contrib.MuonDimensionNumbers
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7  # added to the Frobenius norm before Newton-Schulz (optax's default: 1e-8)


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
