"""Stacks of identical layers: a Python loop or one `nn.scan`, optionally rematerialised.

`apply_layers` runs `x` through the layers of an encoder or decoder stack. Unscanned (the
default) layer i is the submodule "layer_{i}": XLA compiles every layer separately, so compile
time grows with depth. Scanned, the stack is one `flax.linen.scan` over a single submodule
`SCANNED` ("layers") whose variables ("params", the decoding "cache", sown "intermediates") carry
a leading layer axis [num_layers, ...]: the layer is compiled once, whatever the depth.

`remat` names a `jax.checkpoint` policy (`REMAT_POLICIES`): the backward pass recomputes the
activations the policy does not save, trading compute for activation memory.

`stack_layers` / `unstack_layers` convert any pytree (parameters, optimizer state, cache)
between the two layouts, so a checkpoint written with one restores into the other.

Sources: scan over layers, `flax.linen.scan` ("reduce the compilation time ... by merging
multiple layers into a single scan loop"); rematerialisation, Chen et al. 2016 ("Training deep
nets with sublinear memory cost", §3) and `jax.checkpoint` with `jax.checkpoint_policies`.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

SCANNED = "layers"  # the one submodule of a scanned stack
_LAYER = re.compile(r"layer_(\d+)")

# `ModelConfig.remat` -> the `jax.checkpoint` policy (None: save nothing but the layer's input).
_POLICIES = {
    "full": None,
    # Save every matmul output; recompute the rest (norms, activations, softmax, dropout).
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    # Save the matmuls against weights (projections, feed-forward); recompute the attention
    # score and value products, whose outputs grow with L * S.
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
REMAT_POLICIES = ("none", *_POLICIES)


def layer_name(index: int, *, scan: bool) -> str:
    """The submodule that holds layer `index`'s variables: "layer_{index}", or `SCANNED`."""
    return SCANNED if scan else f"layer_{index}"


def _layer_call(kwargs: dict, remat: str, scan: bool) -> Callable[[nn.Module, Any], Any]:
    """call(layer, x) = layer(x, **kwargs), under `nn.remat` with the policy unless "none".

    `kwargs` are closed over, never passed through remat's or scan's arguments: arrays (masks,
    biases, the encoder output) and Python values (`deterministic`, `decode`, objects holding
    callables) reach every layer alike, and a new keyword needs no change here.
    """

    def call(layer: nn.Module, x):
        return layer(x, **kwargs)

    if remat == "none":
        return call
    if remat not in _POLICIES:
        raise ValueError(f"remat={remat!r} is not one of {REMAT_POLICIES}")
    # Inside a scan the loop itself keeps XLA from merging the recomputation with the forward.
    return nn.remat(call, policy=_POLICIES[remat], prevent_cse=not scan)


def apply_layers(
    make_layer: Callable[[str], nn.Module],
    x: jax.Array,
    num_layers: int,
    *,
    scan: bool = False,
    remat: str = "none",
    **kwargs,
) -> jax.Array:
    """x through `num_layers` layers, each `make_layer(name)(x, **kwargs)` -> x of x's shape.

    Call from the stack's compact `__call__`. Unscanned, the layers are "layer_0" ...
    "layer_{n-1}". Scanned, one `nn.scan` runs the layer `SCANNED` n times: its "params",
    "cache" and "intermediates" get a leading [n] axis, and the "params" and "dropout" rngs are
    split per layer (each layer has its own initial weights and dropout masks). A stack of 0
    layers is the identity in both layouts.

    Args:
      make_layer: name -> an unbound layer module (e.g. `lambda n: EncoderLayer(cfg, name=n)`).
      x: the stack's input, e.g. [B, L, D].
      num_layers: n >= 0.
      scan: one `nn.scan` instead of a Python loop.
      remat: one of `REMAT_POLICIES`.
      **kwargs: passed to every layer's call, closed over (see `_layer_call`).
    """
    call = _layer_call(kwargs, remat, scan)
    if not scan or not num_layers:
        for i in range(num_layers):
            x = call(make_layer(layer_name(i, scan=False)), x)
        return x

    def body(layer: nn.Module, carry, _):
        return call(layer, carry), None

    scanned = nn.scan(
        body,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        length=num_layers,
    )
    x, _ = scanned(make_layer(SCANNED), x, None)
    return x


# -------------------------------------------------------------------------------------------
# Converting trees between the unscanned and the scanned layout.


def _layer_indices(node: Mapping) -> list[int]:
    """The i of the "layer_{i}" keys of `node`, sorted; they must be 0 .. n-1."""
    indices = sorted(int(m.group(1)) for k in node if (m := _LAYER.fullmatch(str(k))))
    if indices != list(range(len(indices))):
        raise ValueError(f"layer keys must be layer_0 .. layer_{{n-1}}, got indices {indices}")
    return indices


def _is_unstacked(node: Any) -> bool:
    return isinstance(node, Mapping) and "layer_0" in node


def _is_stacked(node: Any) -> bool:
    return isinstance(node, Mapping) and isinstance(node.get(SCANNED), Mapping)


def _stack(node: Any) -> Any:
    if not _is_unstacked(node):
        return node
    if SCANNED in node:
        raise ValueError(f"cannot stack layers: {sorted(node)} holds both layer_0 and {SCANNED}")
    layers = [node[f"layer_{i}"] for i in _layer_indices(node)]
    rest = {k: v for k, v in node.items() if not _LAYER.fullmatch(str(k))}
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)  # each leaf [n, ...]
    return type(node)({**rest, SCANNED: stacked})


def _unstack(node: Any) -> Any:
    if not _is_stacked(node):
        return node
    stacked = node[SCANNED]
    lengths = {x.shape[0] for x in jax.tree.leaves(stacked)}
    if len(lengths) != 1:
        raise ValueError(f"cannot unstack {SCANNED}: leading axes differ, {sorted(lengths)}")
    (n,) = lengths
    rest = {k: v for k, v in node.items() if k != SCANNED}
    layers = {f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)}
    return type(node)({**rest, **layers})


def stack_layers(tree: Any) -> Any:
    """Unscanned -> scanned layout: "layer_0" .. "layer_{n-1}" become one `SCANNED` subtree.

    Every mapping in `tree` (a parameter tree, an optimizer state holding parameter-shaped
    moments, a decoding cache) that holds "layer_{i}" subtrees gets instead one subtree
    `SCANNED` whose leaves are the layers' leaves stacked on a new leading axis [n, ...].
    Everything else is left as it is. Pure; `jax.eval_shape(stack_layers, abstract)` converts
    shapes without touching arrays. The inverse of `unstack_layers`.

    Raises:
      ValueError: when layer indices have gaps or a mapping holds both layouts.
    """
    return jax.tree.map(_stack, tree, is_leaf=_is_unstacked)


def unstack_layers(tree: Any) -> Any:
    """Scanned -> unscanned layout: each `SCANNED` subtree [n, ...] becomes "layer_0" .. n-1.

    The inverse of `stack_layers` (see there).

    Raises:
      ValueError: when the leaves of a `SCANNED` subtree have different leading axes.
    """
    return jax.tree.map(_unstack, tree, is_leaf=_is_stacked)


def convert_layout(tree: Any, *, scan: bool) -> Any:
    """`tree` in the scanned layout when `scan`, else in the unscanned one (either input)."""
    return stack_layers(unstack_layers(tree)) if scan else unstack_layers(tree)
