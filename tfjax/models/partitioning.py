"""The logical axis names of every parameter: one table, read by the mesh strategy.

Parameters stay plain arrays (`model.init` returns no partitioning boxes, so checkpoints, the
Hugging Face import and the tests read the trees they always read). Instead each kind of
parameter is named here once, by the last two parts of its path (the module that owns it and
the parameter's name), and `logical_axes(params)` gives every parameter of a model its tuple
of axis names, one per dimension:

  name         dimension                     name           dimension
  embed        D, the model width            kv             H, the width of one head
  heads        N, query heads                mlp            F, the MLP hidden width
  kv_heads     K, key/value heads            vocab          V
  qkv_heads    N + 2K (fused "qkv") or 2K    embed_out      a second D (D x D matrices)
               (fused cross-attention "kv")  kv_out         a second H (score weights)
  rank         r of a low-rank value         relpos_buckets relative-position buckets
  positions    rows of a learned table       classes        classifier outputs
  layers       the leading layer axis of a scanned stack (`model.scan_layers`)

Activations carry `batch`, `length`, `embed`, `heads`, `kv_heads`, `kv` and `mlp` through
`flax.linen.with_logical_constraint` in `tfjax.nn` (no-ops outside a rules context).
`parallel.rules` maps these names to mesh axes (`tfjax.parallel.layout`). A parameter the
table does not know makes `logical_axes` raise, naming its path: a new parameter cannot go
unsharded unnoticed (`tests/test_partitioning.py` runs every model variant through it).

Sources: Megatron-LM's split of attention heads and the MLP hidden width (Shoeybi et al.
2019, §3); the logical-name rules of Flax's `flax.linen.spmd` and T5X/MaxText.
"""

import fnmatch
from typing import Any

import jax

from tfjax import errors
from tfjax.nn import stacking

ATTENTION = ("heads", "kv_heads", "qkv_heads", "kv", "kv_out", "rank", "relpos_buckets")
LOGICAL_AXES = (
    *("batch", "length", "embed", "embed_out", "mlp", "vocab", "positions", "classes", "layers"),
    *ATTENTION,
)

# (glob over "module/parameter", axes), first match wins. Shapes: tfjax.nn.attention
# (projections), tfjax.nn.layers, tfjax.nn.positional, tfjax.models.
TABLE = (
    # attention projections: q [D, N, H], k/v [D, K, H], fused [D, N + 2K, H] / [D, 2K, H]
    ("query/kernel", ("embed", "heads", "kv")),
    ("query/bias", ("heads", "kv")),
    ("key/kernel", ("embed", "kv_heads", "kv")),
    ("value/kernel", ("embed", "kv_heads", "kv")),
    ("key/bias", ("kv_heads", "kv")),
    ("value/bias", ("kv_heads", "kv")),
    ("qkv/kernel", ("embed", "qkv_heads", "kv")),
    ("kv/kernel", ("embed", "qkv_heads", "kv")),
    ("qkv/bias", ("qkv_heads", "kv")),
    ("kv/bias", ("qkv_heads", "kv")),
    ("value_down/kernel", ("embed", "rank")),
    ("value_up/kernel", ("rank", "kv_heads", "kv")),
    ("value_up/bias", ("kv_heads", "kv")),
    ("out/kernel", ("heads", "kv", "embed")),
    ("out/bias", ("embed",)),
    # general and additive scores: W [N, H, H], v [N, H]
    ("*/score_w", ("heads", "kv", "kv_out")),
    ("*/score_w_q", ("heads", "kv", "kv_out")),
    ("*/score_w_k", ("heads", "kv", "kv_out")),
    ("*/score_v", ("heads", "kv")),
    # feed-forward: wi, wi_gate [D, F], wo [F, D]
    ("wi/kernel", ("embed", "mlp")),
    ("wi_gate/kernel", ("embed", "mlp")),
    ("wi/bias", ("mlp",)),
    ("wi_gate/bias", ("mlp",)),
    ("wo/kernel", ("mlp", "embed")),
    ("wo/bias", ("embed",)),
    # norms
    ("*norm/scale", ("embed",)),
    ("*norm/bias", ("embed",)),
    # embeddings and positions: tokens [V, E], learned positions [max_len, P], T5 buckets
    ("embed/embedding", ("vocab", "embed")),
    ("pos_embedding/embedding", ("positions", "embed")),
    ("relative_bias/rel_embedding", ("relpos_buckets", "heads")),
    ("embedder/token_type_embedding", ("positions", "embed")),  # rows of a learned table
    # heads: untied logits [D, V], D -> token width before tied logits, pooler, MLM, classifier
    ("logits_dense/kernel", ("embed", "vocab")),
    ("logits_dense/bias", ("vocab",)),
    ("*logits_bias", ("vocab",)),  # top level: no module in its path
    ("logits_proj/kernel", ("embed", "embed_out")),
    ("pooler/kernel", ("embed", "embed_out")),
    ("pooler/bias", ("embed_out",)),
    ("mlm_dense/kernel", ("embed", "embed_out")),
    ("mlm_dense/bias", ("embed_out",)),
    ("classifier/kernel", ("embed", "classes")),
    ("classifier/bias", ("classes",)),
)


def path_names(path: tuple) -> tuple[str, ...]:
    """A `jax.tree_util` key path as strings: dict keys, attribute names, sequence indices."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return tuple(names)


def axes_of(path: tuple[str, ...], ndim: int) -> tuple[str, ...] | None:
    """The logical axes of the parameter at `path` (strings), or None when the table has no
    row for it or the row's rank is not `ndim`. Inside a scanned stack (a `stacking.SCANNED`
    module on the path) the parameter carries a leading "layers" axis."""
    tail = "/".join(path[-2:])
    for pattern, axes in TABLE:
        if fnmatch.fnmatchcase(tail, pattern):
            if stacking.SCANNED in path[:-2]:
                axes = ("layers", *axes)
            return axes if len(axes) == ndim else None
    return None


def logical_axes(params: Any) -> Any:
    """The tree of `params` (arrays or `jax.ShapeDtypeStruct`s) with each leaf replaced by
    its tuple of logical axis names, one per dimension.

    Raises:
        tfjax.errors.ConfigError: for a parameter the table does not name, or names with
            another rank: its path, its shape and where to add it.
    """

    def one(path, x):
        names = path_names(path)
        axes = axes_of(names, len(x.shape))
        if axes is None:
            raise errors.ConfigError(
                f"parameter {'/'.join(names)} of shape {tuple(x.shape)} has no logical axis "
                "names: add a row for it to TABLE in tfjax/models/partitioning.py"
            )
        return axes

    return jax.tree_util.tree_map_with_path(one, params)


def state_axes(tree: Any) -> Any:
    """Logical axes for any tree that holds parameters: a train state, an optimizer state
    (optax keeps Adam's moments as trees shaped like the parameters), or the parameters.

    Each array leaf whose path ends like a parameter's, with that parameter's rank, gets its
    axes; other leaves (step counters, scalars) get None. `logical_axes` is the strict check
    of a parameter tree.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, x: axes_of(path_names(path), len(getattr(x, "shape", ()))), tree
    )
