"""Where arrays live on the mesh: logical axis names mapped to mesh axes by `parallel.rules`.

A rule is a pair (logical name, mesh axes): "tensor", a tuple of mesh axes such as
("data", "fsdp"), or None (replicated). Rules follow Flax's `flax.linen.spmd` semantics: in
order of precedence, the first rule for a name whose mesh axes the array does not use yet.
`DEFAULT_RULES` is Megatron-LM's tensor parallelism (Shoeybi et al. 2019, §3): attention heads
and the MLP hidden width split over "tensor", so each device computes its heads and its slice
of the MLP, with one reduction per block; the batch splits over ("data", "fsdp").

`param_spec` turns a parameter's logical axes into its `PartitionSpec` (rules first, then FSDP
on the largest remaining dimension the fsdp axis divides, as `parallel.fsdp` always did) and
refuses a layout that does not divide, naming the parameter, its shape and the fix.
`activation_rules` is the context in which the model's `with_logical_constraint`s apply.
The logical names themselves belong to the models (`tfjax.models.partitioning`).
"""

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence

import flax.linen as nn
import jax
from jax.sharding import Mesh, PartitionSpec

from tfjax import errors

MESH_AXES = ("data", "fsdp", "tensor")

DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", None),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("qkv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", None),
)

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def normalize_rules(rules: Sequence) -> Rules:
    """`rules` as a tuple of (name, None | axis | tuple of axes) pairs: a config read back from
    JSON holds lists where the config file had tuples.

    Raises:
        tfjax.errors.ConfigError: for an entry that is not a (name, mesh axes) pair.
    """
    normalized = []
    for rule in rules:
        if not isinstance(rule, list | tuple) or len(rule) != 2 or not isinstance(rule[0], str):
            raise errors.ConfigError(
                f"parallel.rules entry {rule!r} is not a (logical name, mesh axes) pair, "
                "e.g. ('heads', 'tensor') or ('batch', ('data', 'fsdp'))"
            )
        name, axes = rule
        if isinstance(axes, list | tuple):
            axes = axes[0] if len(axes) == 1 else tuple(axes) or None
        normalized.append((name, axes))
    return tuple(normalized)


def check_rules(rules: Sequence, known_names: Sequence[str] | None = None) -> Rules:
    """Normalised `rules`, refused when one names a mesh axis not in `MESH_AXES` or (with
    `known_names`) a logical name that nothing carries.

    Raises:
        tfjax.errors.ConfigError: naming the rule and the valid names.
    """
    rules = normalize_rules(rules)
    for name, axes in rules:
        for axis in _axes(axes):
            if axis not in MESH_AXES:
                raise errors.ConfigError(
                    f"parallel.rules maps {name!r} to mesh axis {axis!r}, which the mesh does "
                    f"not have: use one of {', '.join(MESH_AXES)} or None"
                )
        if known_names is not None and name not in known_names:
            raise errors.ConfigError(
                f"parallel.rules names the logical axis {name!r}, which no parameter or "
                f"activation carries: use one of {', '.join(known_names)}"
            )
    return rules


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def param_spec(
    name: str,
    shape: tuple[int, ...],
    axes: tuple[str, ...] | None,
    rules: Rules,
    sizes: Mapping[str, int],
    fsdp_min_size: int,
) -> PartitionSpec:
    """The `PartitionSpec` of parameter `name` of `shape` on a mesh of `sizes`.

    `axes` (its logical names; None for arrays without any, e.g. step counters) are mapped by
    `rules`; mesh axes of size 1 split nothing and are left out. Then, when the array has at
    least `fsdp_min_size` elements and does not use "fsdp" yet, its largest dimension that is
    still whole and divisible by the fsdp axis is split over it (ZeRO-3 / FSDP); a scanned
    stack's "layers" axis never is.

    Raises:
        tfjax.errors.ConfigError: when a mapped dimension does not divide over its mesh axes.
    """
    mapped = [()] * len(shape)
    if axes is not None:
        resolved = nn.logical_to_mesh_axes(axes, rules)
        for dim, entry in enumerate(resolved):
            used = tuple(axis for axis in _axes(entry) if sizes.get(axis, 1) > 1)
            split = math.prod(sizes[axis] for axis in used)
            if shape[dim] % split:
                raise _indivisible(name, shape, dim, axes[dim], used, sizes)
            mapped[dim] = used
    fsdp = sizes.get("fsdp", 1)
    taken = {axis for entry in mapped for axis in entry}
    if fsdp > 1 and "fsdp" not in taken and math.prod(shape) >= fsdp_min_size:
        for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
            # A scanned stack's "layers" axis is sliced every iteration: never split it.
            stacked = axes is not None and axes[dim] == "layers"
            if not mapped[dim] and not stacked and shape[dim] % fsdp == 0:
                mapped[dim] = ("fsdp",)
                break
    if not any(mapped):
        return PartitionSpec()  # replicated
    return PartitionSpec(*(None if not e else e[0] if len(e) == 1 else e for e in mapped))


def _indivisible(name, shape, dim, logical, used, sizes) -> errors.ConfigError:
    where = " x ".join(f"{axis}={sizes[axis]}" for axis in used)
    fix = f"a parallel.{used[0]}" if len(used) == 1 else "mesh sizes whose product"
    return errors.ConfigError(
        f"parameter {name} of shape {tuple(shape)}: its {logical!r} dimension ({shape[dim]}) "
        f"does not split over mesh axis {where}; choose {fix} that divides {shape[dim]}, or "
        f"replicate it with the rule ({logical!r}, None) in parallel.rules"
    )


def batch_spec(rules: Rules) -> PartitionSpec:
    """How a batch [B, ...] is split: by the rule of the logical name "batch"."""
    return nn.logical_to_mesh_axes(("batch",), rules)


@contextlib.contextmanager
def activation_rules(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Inside, the model's `with_logical_constraint`s pin activations to `mesh` by `rules`.

    Enter it while the step is traced (inside the jitted function): it sets the abstract mesh,
    which is allowed under `jax.jit`, and Flax's rules context.
    """
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield
