"""Data parallelism in one place: `jax.pmap` over local devices, or `jax.jit` on a device mesh.

Both strategies wrap the same pure `train_step(state, batch, rng, axis_name=None)`; nothing else
in tfjax knows which one runs (docs/design.md, "One code path from CPU to pod").
- "pmap": the state is replicated on every local device, each device takes B / n rows
  of the host's batch, gradients are summed over the "batch" axis inside the step.
- "sharded" (the configs' default): one jitted program over a `Mesh` with axes
  ("data", "fsdp", "tensor"); the batch is split over ("data", "fsdp"), parameters are laid
  out by their logical axis names and
  `parallel.rules` (`tfjax.parallel.layout`: by default attention heads and the MLP hidden
  width over "tensor", Megatron-style) and, with an fsdp axis > 1, sharded along their largest
  remaining divisible dimension (ZeRO-3 / FSDP style: Rajbhandari et al. 2020).
Multi-process (`tfjax.parallel.distributed`): the mesh spans the devices of every process, and
each process feeds the rows of every global batch that its own devices hold (`host_rows`), so
the global batch, and the trained model, do not depend on how the devices are split into
processes. Checkpoints hold global arrays (`checkpoint_state`, `restore_target`): orbax writes
each shard once, from the process that holds it, and reads back onto any topology.
"""

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax import errors
from tfjax.parallel import layout

MODES = ("pmap", "sharded")
# The mesh of mode "sharded"; each axis but "data" has the size of the `parallel` config field
# of its name (the data axis takes the remaining devices).
MESH_AXES = layout.MESH_AXES
AXIS_NAME = "batch"
# Arrays with fewer elements stay replicated under FSDP: gathering them costs more than they save.
FSDP_MIN_SIZE = 2**14


def host_batch_size(global_batch_size: int) -> int:
    """Rows this host loads: the global batch split evenly over processes and local devices."""
    hosts, local = jax.process_count(), jax.local_device_count()
    if global_batch_size % (hosts * local):
        raise errors.ConfigError(
            f"train.global_batch_size={global_batch_size} must be divisible by the number of "
            f"devices ({hosts} hosts x {local} local devices = {hosts * local})"
        )
    return global_batch_size // hosts


def _process_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> slice:
    """The block of dim 0 of a global array of `shape` that this process's devices hold.

    Raises:
        ValueError: if those rows are not one contiguous block (a device order that
            interleaves processes), since then no host-local slice of the batch fits.
    """
    indices = sharding.addressable_devices_indices_map(shape).values()
    blocks = sorted({index[0].indices(shape[0])[:2] for index in indices})  # (start, stop)
    for (_, stop), (start, _) in itertools.pairwise(blocks):
        if start != stop:
            raise ValueError(
                f"the devices of process {jax.process_index()} hold rows {blocks} of the batch, "
                "not one block: build the mesh with each process's devices next to each other"
            )
    return slice(blocks[0][0], blocks[-1][1])


def _local_value(x: Any) -> Any:
    """`x` as a value this process can read whole: a replicated global array's local copy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if not x.is_fully_replicated:
            raise ValueError(f"expected a replicated array, got one sharded as {x.sharding}")
        return x.addressable_data(0)
    return x


class Pmap:
    """Replicated state, batch split over devices, `lax.psum` in the step.

    Arrays are global `jax.Array`s with a leading device axis, laid out on a 1-D mesh over all
    devices; each host only touches its addressable shards, so this also runs multi-host.
    """

    def __init__(self):
        self.local_devices = jax.local_devices()
        self.mesh = Mesh(np.array(jax.devices()), (AXIS_NAME,))
        self.sharding = NamedSharding(self.mesh, PartitionSpec(AXIS_NAME))

    def put_state(self, state: Any) -> Any:
        """One copy of every leaf per device: [n_devices, ...]."""

        def replicate(x):
            x = jnp.asarray(_local_value(x))
            shards = [jax.device_put(x[None], d) for d in self.local_devices]
            return jax.make_array_from_single_device_arrays(
                (jax.device_count(), *x.shape), self.sharding, shards
            )

        return jax.tree.map(replicate, state)

    def host_state(self, state: Any) -> Any:
        """The first local replica: arrays this process holds whole, for evaluation."""
        return jax.tree.map(_first_replica, state)

    def host_params(self, state: Any) -> Any:
        """The parameters as arrays this process holds whole (`host_state(state).params`)."""
        return jax.tree.map(_first_replica, state.params)

    def host_rows(self, global_batch_size: int) -> slice:
        """The rows of every global batch this process feeds (its devices' rows, in order)."""
        per_device = host_batch_size(global_batch_size) // len(self.local_devices)
        devices = _process_rows(self.sharding, (jax.device_count(),))
        return slice(devices.start * per_device, devices.stop * per_device)

    def checkpoint_state(self, state: Any) -> Any:
        """The state as global arrays replicated on the mesh, without the device axis.

        orbax writes each array once (split among the replicas, so every process writes part)
        and `restore_target` reads it back on any number of processes and devices.
        """
        replicated = NamedSharding(self.mesh, PartitionSpec())

        def unstack(x):
            copies = [shard.data[0] for shard in x.addressable_shards]  # one per local device
            return jax.make_array_from_single_device_arrays(x.shape[1:], replicated, copies)

        return jax.tree.map(unstack, state)

    def restore_target(self, abstract_state: Any) -> Any:
        """Where a restored checkpoint goes: replicated on the mesh (`put_state` then stacks it)."""
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return _placed(abstract_state, jax.tree.map(lambda _: replicated, abstract_state))

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        n = len(self.local_devices)

        def split(x):
            if x.shape[0] % n:
                raise ValueError(f"batch of {x.shape[0]} rows does not split over {n} devices")
            local = x.reshape(n, x.shape[0] // n, *x.shape[1:])  # [n, B / n, ...]
            return jax.make_array_from_process_local_data(self.sharding, local)

        return jax.tree.map(split, batch)

    def compile_train_step(self, train_step: Callable, abstract_state: Any) -> Callable:
        del abstract_state
        step = jax.pmap(
            functools.partial(train_step, axis_name=AXIS_NAME),
            axis_name=AXIS_NAME,
            in_axes=(0, 0, None),
            donate_argnums=(0,),
        )

        def run(state, batch, rng):
            state, metrics = step(state, batch, rng)
            return state, jax.tree.map(_first_replica, metrics)

        return run


def _first_replica(x: jax.Array) -> jax.Array:
    return x.addressable_shards[0].data[0]


def _placed(abstract_state: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `abstract_state`'s leaves, each with its sharding from the
    matching tree `shardings`."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
    )


def _fsdp_spec(shape: tuple[int, ...], fsdp: int, min_size: int = FSDP_MIN_SIZE) -> PartitionSpec:
    """Shards the largest dimension divisible by the fsdp axis; replicates arrays of fewer
    than `min_size` elements (`layout.param_spec` for an array without logical names)."""
    return layout.param_spec("array", shape, None, (), {"fsdp": fsdp}, min_size)


class Sharded:
    """`jax.jit` with `NamedSharding` on the mesh ("data", "fsdp", "tensor").

    The batch is split by the rule of "batch" (default: over "data" and "fsdp"); every leaf of
    the train state is placed by `layout.param_spec`: its logical axes (from `logical_axes`, a
    function of the state tree such as `tfjax.models.partitioning.state_axes`) mapped by
    `rules`, then FSDP. The step is traced inside `layout.activation_rules`, so the model's
    activation constraints apply. Without `logical_axes` parameters are only FSDP-sharded.

    `devices` (default: all of the job's) may be devices of a topology this host does not have
    (`tfjax.parallel.topology`): the step then compiles ahead of time but cannot run.
    """

    def __init__(
        self,
        fsdp: int = 1,
        fsdp_min_size: int = FSDP_MIN_SIZE,
        devices: Sequence[jax.Device] | None = None,
        *,
        tensor: int = 1,
        rules: Sequence = layout.DEFAULT_RULES,
        logical_axes: Callable[[Any], Any] | None = None,
    ):
        devices = list(jax.devices() if devices is None else devices)
        if fsdp < 1 or tensor < 1 or len(devices) % (fsdp * tensor):
            raise errors.ConfigError(
                f"parallel.fsdp={fsdp} x parallel.tensor={tensor} must divide the device count "
                f"{len(devices)}"
            )
        if tensor > 1 and logical_axes is None:
            raise ValueError("parallel.tensor > 1 needs the parameters' logical_axes")
        self.fsdp, self.tensor = fsdp, tensor
        self.fsdp_min_size = fsdp_min_size
        self.rules = layout.check_rules(rules)
        self.logical_axes = logical_axes
        self.mesh = Mesh(np.array(devices).reshape(-1, fsdp, tensor), MESH_AXES)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.batch_sharding = NamedSharding(self.mesh, layout.batch_spec(self.rules))
        self.state_sharding = None

    def shardings(self, abstract_state: Any) -> Any:
        """A `NamedSharding` per leaf of `abstract_state` (any tree of arrays or shapes).

        Raises:
            tfjax.errors.ConfigError: for a parameter whose mapped dimension does not divide.
        """
        sizes = dict(self.mesh.shape)
        if self.logical_axes is None:
            axes = jax.tree.map(lambda _: None, abstract_state)
        else:
            axes = self.logical_axes(abstract_state)

        def place(path, x, names):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            spec = layout.param_spec(
                name, tuple(x.shape), names, self.rules, sizes, self.fsdp_min_size
            )
            return NamedSharding(self.mesh, spec)

        return jax.tree_util.tree_map_with_path(place, abstract_state, axes)

    def put_state(self, state: Any) -> Any:
        if self.state_sharding is None:
            self.state_sharding = self.shardings(jax.eval_shape(lambda: state))
        return jax.device_put(state, self.state_sharding)

    def host_state(self, state: Any) -> Any:
        """The state as arrays this process holds whole: as it is in one process, gathered
        from every process otherwise (evaluation runs on the local devices)."""
        if jax.process_count() == 1:
            return state
        gathered = jax.jit(lambda tree: tree, out_shardings=self.replicated)(state)
        return jax.tree.map(_local_value, gathered)

    def host_params(self, state: Any) -> Any:
        """The parameters as arrays this process holds whole (see `host_state`)."""
        return self.host_state(state.params)

    def host_rows(self, global_batch_size: int) -> slice:
        """The rows of every global batch this process feeds (its devices' rows, in order)."""
        host_batch_size(global_batch_size)  # says which counts would not divide
        return _process_rows(self.batch_sharding, (global_batch_size,))

    def checkpoint_state(self, state: Any) -> Any:
        """The state as it is: global arrays whose shards orbax writes from their processes."""
        return state

    def restore_target(self, abstract_state: Any) -> Any:
        """Where a restored checkpoint goes: straight into the train step's shardings."""
        return _placed(abstract_state, self.shardings(abstract_state))

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(self.batch_sharding, x), batch
        )

    def abstract_inputs(self, abstract_state: Any, batch: dict[str, jax.ShapeDtypeStruct]) -> tuple:
        """(state, batch, rng) as `jax.ShapeDtypeStruct`s placed as the compiled step takes
        them: what `compile_train_step(...).lower(*inputs)` needs to compile without data."""

        def place(tree, sharding):
            return jax.tree.map(
                lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sharding
            )

        state = place(abstract_state, self.shardings(abstract_state))
        batch = place(batch, jax.tree.map(lambda _: self.batch_sharding, batch))
        rng = jax.eval_shape(lambda: jax.random.key(0))
        return state, batch, jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=self.replicated)

    def compile_train_step(self, train_step: Callable, abstract_state: Any) -> Callable:
        self.state_sharding = self.shardings(abstract_state)

        def step(state, batch, rng):
            with layout.activation_rules(self.mesh, self.rules):
                return train_step(state, batch, rng)

        return jax.jit(
            step,
            in_shardings=(self.state_sharding, self.batch_sharding, self.replicated),
            out_shardings=(self.state_sharding, self.replicated),
            donate_argnums=(0,),
        )


def create(
    mode: str,
    *,
    fsdp: int = 1,
    fsdp_min_size: int = FSDP_MIN_SIZE,
    devices: Sequence[jax.Device] | None = None,
    tensor: int = 1,
    rules: Sequence = layout.DEFAULT_RULES,
    logical_axes: Callable[[Any], Any] | None = None,
) -> Pmap | Sharded:
    """The strategy for `parallel.mode` (one of `MODES`); `fsdp_min_size`: see `_fsdp_spec`;
    `tensor`, `rules` and `logical_axes`: see `Sharded`.

    `devices` (mode "sharded" only) replaces the job's devices, e.g. by a topology's
    compile-only devices for ahead-of-time planning.
    """
    if mode == "pmap":
        for name, size in (("fsdp", fsdp), ("tensor", tensor)):
            if size != 1:
                raise errors.ConfigError(f"parallel.{name} > 1 needs parallel.mode='sharded'")
        if devices is not None:
            raise ValueError("Pmap runs on the job's own devices; plan with mode='sharded'")
        return Pmap()
    if mode == "sharded":
        return Sharded(
            fsdp, fsdp_min_size, devices, tensor=tensor, rules=rules, logical_axes=logical_axes
        )
    raise errors.ConfigError(f"parallel.mode={mode!r} is not one of {MODES}")
