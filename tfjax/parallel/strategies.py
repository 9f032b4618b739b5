"""Data parallelism in one place: `jax.pmap` over local devices, or `jax.jit` on a device mesh.

Both strategies wrap the same pure `train_step(state, batch, rng, axis_name=None)`; nothing else
in tfjax knows which one runs (STYLE.md §9).
- "pmap" (default): the state is replicated on every local device, each device takes B / n rows
  of the host's batch, gradients are summed over the "batch" axis inside the step.
- "sharded": one jitted program over a `Mesh` with axes ("data", "fsdp"); the batch is split
  over all devices, parameters are replicated or, with an fsdp axis > 1, sharded along their
  largest divisible dimension (ZeRO-3 / FSDP style: Rajbhandari et al. 2020).
Multi-host: `initialize_distributed` calls `jax.distributed.initialize()`; every host feeds its
own slice of the global batch (the per-host batch size is global / process_count).
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax import errors

MODES = ("pmap", "sharded")
# The mesh of mode "sharded"; each axis but "data" has the size of the `parallel` config field
# of its name (the data axis takes the remaining devices).
MESH_AXES = ("data", "fsdp")
AXIS_NAME = "batch"
# Arrays with fewer elements stay replicated under FSDP: gathering them costs more than they save.
FSDP_MIN_SIZE = 2**14


def initialize_distributed() -> None:
    """Joins a multi-host job (TPU pods, multi-node GPU); call before any other jax call."""
    jax.distributed.initialize()


def host_batch_size(global_batch_size: int) -> int:
    """Rows this host loads: the global batch split evenly over processes and local devices."""
    hosts, local = jax.process_count(), jax.local_device_count()
    if global_batch_size % (hosts * local):
        raise errors.ConfigError(
            f"train.global_batch_size={global_batch_size} must be divisible by the number of "
            f"devices ({hosts} hosts x {local} local devices = {hosts * local})"
        )
    return global_batch_size // hosts


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
            x = jnp.asarray(x)
            shards = [jax.device_put(x[None], d) for d in self.local_devices]
            return jax.make_array_from_single_device_arrays(
                (jax.device_count(), *x.shape), self.sharding, shards
            )

        return jax.tree.map(replicate, state)

    def host_state(self, state: Any) -> Any:
        """The first local replica, for checkpointing and evaluation."""
        return jax.tree.map(_first_replica, state)

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


def _fsdp_spec(shape: tuple[int, ...], fsdp: int, min_size: int = FSDP_MIN_SIZE) -> PartitionSpec:
    """Shards the largest dimension divisible by the fsdp axis; replicates arrays of fewer
    than `min_size` elements."""
    if fsdp <= 1 or not shape or int(np.prod(shape)) < min_size:
        return PartitionSpec()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp == 0:
            spec = [None] * len(shape)
            spec[dim] = "fsdp"
            return PartitionSpec(*spec)
    return PartitionSpec()


class Sharded:
    """`jax.jit` with `NamedSharding`: batch over ("data", "fsdp"), parameters over "fsdp".

    `devices` (default: all of the job's) may be devices of a topology this host does not have
    (`tfjax.parallel.topology`): the step then compiles ahead of time but cannot run.
    """

    def __init__(
        self,
        fsdp: int = 1,
        fsdp_min_size: int = FSDP_MIN_SIZE,
        devices: Sequence[jax.Device] | None = None,
    ):
        devices = list(jax.devices() if devices is None else devices)
        if fsdp < 1 or len(devices) % fsdp:
            raise errors.ConfigError(
                f"parallel.fsdp={fsdp} must divide the device count {len(devices)}"
            )
        self.fsdp = fsdp
        self.fsdp_min_size = fsdp_min_size
        self.mesh = Mesh(np.array(devices).reshape(-1, fsdp), MESH_AXES)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(("data", "fsdp")))
        self.state_sharding = None

    def shardings(self, abstract_state: Any) -> Any:
        return jax.tree.map(
            lambda x: NamedSharding(
                self.mesh, _fsdp_spec(tuple(x.shape), self.fsdp, self.fsdp_min_size)
            ),
            abstract_state,
        )

    def put_state(self, state: Any) -> Any:
        if self.state_sharding is None:
            self.state_sharding = self.shardings(jax.eval_shape(lambda: state))
        return jax.device_put(state, self.state_sharding)

    def host_state(self, state: Any) -> Any:
        return state

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
        return jax.jit(
            train_step,
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
) -> Pmap | Sharded:
    """The strategy for `parallel.mode` (one of `MODES`); `fsdp_min_size`: see `_fsdp_spec`.

    `devices` (mode "sharded" only) replaces the job's devices, e.g. by a topology's
    compile-only devices for ahead-of-time planning.
    """
    if mode == "pmap":
        if fsdp != 1:
            raise errors.ConfigError("parallel.fsdp > 1 needs parallel.mode='sharded'")
        if devices is not None:
            raise ValueError("Pmap runs on the job's own devices; plan with mode='sharded'")
        return Pmap()
    if mode == "sharded":
        return Sharded(fsdp, fsdp_min_size, devices)
    raise errors.ConfigError(f"parallel.mode={mode!r} is not one of {MODES}")
