"""Plan a training run for a device slice this machine does not have: compile it ahead of time.

`plan(config, topology)` builds the run's model, optimizer, train step and parallel strategy
with the functions `tfjax.runs.build` trains with, so the mesh and the shardings are the ones
training would use (a new mesh axis or sharding rule there is planned here too), but from
shapes alone: the train state comes from `jax.eval_shape`, the batch is `jax.ShapeDtypeStruct`s
of the configured size, and `jax.jit(...).lower(...).compile()` compiles the step for the
topology's devices (`tfjax.parallel.topology`). Nothing is allocated, no data is read: the 1B
decoder of `configs/lm.py:1b` plans on a 2-core CPU machine (about 5 GB of memory and 3 minutes
of compiling for a TPU slice). What the compiled program says (`tfjax.parallel.costs`) becomes a
`Plan`: bytes per device, whether they fit the chip, the collectives, FLOPs and a roofline.

Sources: JAX's "Ahead-of-time lowering and compilation" guide (`jax.stages`) and
`jax.experimental.topologies` (compile-only devices).
"""

import copy
import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from tfjax import errors, models
from tfjax.data import datasets
from tfjax.models import flops, kinds
from tfjax.parallel import costs, strategies
from tfjax.parallel import topology as topology_lib
from tfjax.runs import build


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one train step of a config costs on a topology; bytes are per device."""

    topology: str
    device_kind: str
    devices: int
    chips: int
    chip: topology_lib.Chip | None  # whose datasheet applies; None: no HBM, peak or roofline
    mesh: dict[str, int]
    notes: tuple[str, ...]
    num_params: int
    tokens_per_step: int
    params_bytes: int  # the shards of the parameters one device holds
    opt_state_bytes: int  # ... of the optimizer state
    batch_bytes: int  # ... of the batch
    memory: costs.Memory  # the compiler's buffer assignment (arguments include the above)
    collectives: dict[str, dict[str, int]]
    loops: int  # `while` loops in the program: their bodies count once in XLA's costs
    model_flops: float  # one step, all devices (`tfjax.models.flops`)
    compiled_flops: float  # one step, all devices (XLA's count per device x devices)
    bytes_accessed: float  # one step, one device
    compile_seconds: float

    @property
    def hbm_bytes(self) -> float | None:
        """The HBM of one device: the chip's, shared by its devices."""
        return None if self.chip is None else self.chip.hbm_bytes / self.devices_per_chip

    @property
    def devices_per_chip(self) -> int:
        return max(1, self.devices // self.chips)

    @property
    def fits(self) -> bool | None:
        return None if self.hbm_bytes is None else self.memory.peak <= self.hbm_bytes

    @property
    def roofline(self) -> dict[str, Any] | None:
        """Step time at the chip's datasheet peak or bandwidth, and the MFU it would give.

        The compute term takes XLA's FLOPs, or the model FLOPs where XLA counts fewer (its
        cost analysis counts a loop body once: `loops`); `flops_from` says which.
        """
        if self.chip is None:
            return None
        share = self.devices_per_chip
        step_flops = max(self.compiled_flops, self.model_flops)
        bound = costs.roofline(
            step_flops / self.devices,
            self.bytes_accessed,
            self.chip.peak_flops / share,
            self.chip.hbm_bandwidth / share,
        )
        peak = self.chip.peak_flops / share * self.devices
        bound["mfu"] = self.model_flops / (bound["step_s"] * peak) if bound["step_s"] else None
        bound["tokens_per_s"] = self.tokens_per_step / bound["step_s"] if bound["step_s"] else None
        bound["flops_from"] = "compiled" if step_flops == self.compiled_flops else "model"
        return bound

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields, the derived ones included."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["chip"] = None if self.chip is None else dataclasses.asdict(self.chip)
        fields["memory"] = {**dataclasses.asdict(self.memory), "peak": self.memory.peak}
        fields["notes"] = list(self.notes)
        for name in ("hbm_bytes", "fits", "roofline", "devices_per_chip"):
            fields[name] = getattr(self, name)
        return fields


def plan(config: ml_collections.ConfigDict, topology: topology_lib.Topology) -> Plan:
    """Compiles the train step of `config` for `topology` and reads what it costs.

    `parallel.mode="pmap"` is planned as its jit twin, mode "sharded" with fsdp 1 (the same
    replicated state and split batch; pmap cannot compile for devices it does not have).

    Raises:
        tfjax.errors.ConfigError: for a config the topology cannot run: a mesh or batch that
            does not divide its devices, a vocabulary only the data would tell.
    """
    config, notes = _as_sharded(config)
    model_config = build.make_model_config(config, _tokenizer_vocab_size(config))
    model = models.create_model(model_config)
    optimizer, schedule = build.make_optimizer(config, model_config)
    strategy = build.make_strategy(config, devices=topology.devices)
    rows = datasets.train_row_shapes(
        datasets.DataConfig(**config.data),
        kinds.get(model_config.kind),
        model_config.encoder_head,
    )
    batch_size = _check_batch(config.train.global_batch_size, topology)
    sample = {k: np.zeros((1, *shape), np.int32) for k, shape in rows.items()}
    abstract_state = build.abstract_train_state(model, optimizer, sample, model_config.kind)
    train_step = build.make_train_step(config, model, optimizer, schedule)
    step = strategy.compile_train_step(train_step, abstract_state)
    batch = {k: jax.ShapeDtypeStruct((batch_size, *s), jnp.int32) for k, s in rows.items()}
    state, batch, rng = strategy.abstract_inputs(abstract_state, batch)
    start = time.perf_counter()
    compiled = _compile(step.lower(state, batch, rng), state, topology.name)
    seconds = time.perf_counter() - start
    flops_per_device, bytes_accessed = costs.cost(compiled)
    hlo_text = compiled.as_text()
    return Plan(
        topology=topology.name,
        device_kind=topology.devices[0].device_kind,
        devices=len(topology.devices),
        chips=topology.chips,
        chip=topology.chip,
        mesh=dict(strategy.mesh.shape),
        notes=notes,
        num_params=sum(x.size for x in jax.tree.leaves(abstract_state.params)),
        tokens_per_step=_tokens(batch),
        params_bytes=_device_bytes(state.params),
        opt_state_bytes=_device_bytes(state.opt_state),
        batch_bytes=_device_bytes(batch),
        memory=costs.memory(compiled),
        collectives=costs.collectives(hlo_text),
        loops=costs.loops(hlo_text),
        model_flops=_model_flops(model_config, abstract_state.params, rows, batch_size),
        compiled_flops=flops_per_device * len(topology.devices),
        bytes_accessed=bytes_accessed,
        compile_seconds=seconds,
    )


def _compile(lowered, state, topology: str):
    """`lowered.compile()`; a step the compiler cannot fit into a device's memory (TPU
    compilers refuse it) is a one-line `ConfigError` with the state's bytes and the fixes."""
    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        reason = " ".join(str(e).split("RESOURCE_EXHAUSTED:", 1)[1].split())
        raise errors.ConfigError(
            f"the step does not fit {topology}: {reason.rstrip('.')}; per device the "
            f"parameters take {_size(_device_bytes(state.params))} and the optimizer state "
            f"{_size(_device_bytes(state.opt_state))}; try a larger slice, more parallel.fsdp "
            "or parallel.tensor, a smaller train.global_batch_size, or "
            "model.scan_layers=true with model.remat=full"
        ) from None


def _as_sharded(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, tuple]:
    if config.parallel.mode != "pmap":
        return config, ()
    config = copy.deepcopy(config)
    config.parallel.mode = "sharded"
    note = "parallel.mode='pmap' planned as mode='sharded' with fsdp=1 (the same layout, in jit)"
    return config, (note,)


def _tokenizer_vocab_size(config: ml_collections.ConfigDict) -> int:
    """The vocabulary `model.vocab_size=0` stands for, where the config alone tells it."""
    if config.model.vocab_size:
        return config.model.vocab_size
    if config.data.tokenizer == "sentencepiece":
        return config.data.vocab_size
    raise errors.ConfigError(
        f"model.vocab_size=0 means the size of the {config.data.tokenizer} tokenizer, known only "
        "after reading the data: pass --config.model.vocab_size=N to plan"
    )


def _check_batch(batch_size: int, topology: topology_lib.Topology) -> int:
    devices = len(topology.devices)
    if batch_size % devices:
        raise errors.ConfigError(
            f"train.global_batch_size={batch_size} does not split over the {devices} devices "
            f"of {topology.name}: pass --config.train.global_batch_size=N, N a multiple of "
            f"{devices}"
        )
    return batch_size


def _device_bytes(tree: Any) -> int:
    """Bytes of the shards device 0 holds of a tree of placed `ShapeDtypeStruct`s."""
    return costs.sharded_bytes(tree, jax.tree.map(lambda x: x.sharding, tree))


def _tokens(batch: dict[str, jax.ShapeDtypeStruct]) -> int:
    """Target tokens per step (input tokens for encoder-only models), padding included."""
    key = "targets" if "targets" in batch else "inputs"
    return int(np.prod(batch[key].shape))


def _model_flops(model_config, params, rows: dict, batch_size: int) -> float:
    return flops.train_flops(
        model_config,
        params,
        batch=batch_size,
        source_len=rows["inputs"][0] if "inputs" in rows else 0,
        target_len=rows["targets"][0] if "targets" in rows else 0,
    )


def apply_mesh(
    config: ml_collections.ConfigDict, spec: str, num_devices: int
) -> ml_collections.ConfigDict:
    """A copy of `config` whose `parallel` group lays out the mesh `spec` on `num_devices`.

    Args:
        config: a run config.
        spec: "AXIS:SIZE,..." over `strategies.MESH_AXES`, e.g. "data:4,fsdp:4"; an axis left
            out has size 1, but "data", which takes the devices the others leave.
        num_devices: the topology's device count.

    Returns:
        The config with `parallel.mode="sharded"` and each non-data axis in its field.

    Raises:
        tfjax.errors.ConfigError: for a malformed spec, an unknown axis, or sizes whose
            product is not `num_devices`.
    """
    sizes = _parse_mesh(spec)
    others = [axis for axis in strategies.MESH_AXES if axis != "data"]
    unknown = [axis for axis in sizes if axis not in strategies.MESH_AXES]
    if unknown:
        raise errors.ConfigError(
            f"--mesh={spec}: unknown axis {unknown[0]!r}; the mesh axes are "
            f"{', '.join(strategies.MESH_AXES)}"
        )
    split = math.prod(sizes.get(axis, 1) for axis in others)
    if "data" not in sizes and num_devices % split:
        raise errors.ConfigError(
            f"--mesh={spec} does not divide the topology's {num_devices} devices: choose sizes "
            f"whose product divides {num_devices}"
        )
    total = sizes.get("data", num_devices // split) * split
    if total != num_devices:
        raise errors.ConfigError(
            f"--mesh={spec} lays out {total} devices, the topology has {num_devices}: make the "
            f"sizes multiply to {num_devices}"
        )
    config = copy.deepcopy(config)
    config.parallel.mode = "sharded"
    for axis in others:
        config.parallel[axis] = sizes.get(axis, 1)
    return config


def _parse_mesh(spec: str) -> dict[str, int]:
    sizes = {}
    for item in spec.split(","):
        axis, _, size = item.strip().partition(":")
        if not size.isdigit() or int(size) < 1 or axis in sizes:
            raise errors.ConfigError(
                f"--mesh={spec} is not AXIS:SIZE,... with each axis once and sizes >= 1, "
                "e.g. data:4,fsdp:4"
            )
        sizes[axis] = int(size)
    return sizes


def report(result: Plan, name: str = "") -> list[str]:
    """`result` as the lines `python -m experiments.plan` prints; `name` is the config's."""
    chip, mem = result.chip, result.memory
    lines = [
        f"plan {name} on {result.topology}: {result.devices} devices ({result.device_kind}), "
        f"{result.chips} chips; " + _datasheet(chip),
        *(f"note: {note}" for note in result.notes),
        "mesh " + " x ".join(f"{axis} {size}" for axis, size in result.mesh.items()),
        f"model {result.num_params / 1e6:,.1f}M parameters; "
        f"{result.tokens_per_step:,} tokens per step",
        "per device:",
        f"  parameters {_size(result.params_bytes)}, optimizer state "
        f"{_size(result.opt_state_bytes)}, batch {_size(result.batch_bytes)}",
        f"  compiler: arguments {_size(mem.arguments)}, outputs {_size(mem.outputs)} "
        f"({_size(mem.aliased)} in donated buffers), temporaries {_size(mem.temporaries)}, "
        f"code {_size(mem.code)}",
        f"  peak {_size(mem.peak)}" + _fit(result),
        "collectives: "
        + (
            ", ".join(
                f"{op} x{c['count']} ({_size(c['bytes'])})" for op, c in result.collectives.items()
            )
            or "none"
        ),
        f"FLOPs per step: model {result.model_flops:.3g}, compiled {result.compiled_flops:.3g} "
        f"(XLA's count, all devices; {result.loops} loops, whose bodies it counts once)",
        _roofline_line(result.roofline),
        f"compiled in {result.compile_seconds:.1f} s; all numbers are the compiler's estimates "
        "for one step, not measurements",
    ]
    return lines


def _size(n: int | float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _datasheet(chip: topology_lib.Chip | None) -> str:
    if chip is None:
        return "no datasheet (--chip=NAME gives HBM and a roofline)"
    return (
        f"datasheet {chip.name}: {chip.peak_flops / 1e12:,.0f} TFLOP/s bf16, "
        f"{_size(chip.hbm_bytes)} HBM at {chip.hbm_bandwidth / 1e9:,.0f} GB/s per chip"
    )


def _fit(result: Plan) -> str:
    if result.fits is None:
        return ""
    verdict = "fits" if result.fits else "does NOT fit"
    return f" of {_size(result.hbm_bytes)} HBM: {verdict}"


def _roofline_line(bound: dict[str, Any] | None) -> str:
    if bound is None:
        return "roofline: no datasheet"
    return (
        f"roofline: compute {bound['compute_s'] * 1e3:.3g} ms, memory "
        f"{bound['memory_s'] * 1e3:.3g} ms -> {bound['step_s'] * 1e3:.3g} ms per step "
        f"({bound['bound']}-bound, {bound['flops_from']} FLOPs), "
        f"{bound['tokens_per_s']:,.0f} tokens/s, MFU {bound['mfu']:.0%} at that bound"
    )
