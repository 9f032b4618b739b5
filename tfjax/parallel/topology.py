"""Devices to compile for without having them: TPU slices from libtpu, or simulated CPUs.

`get_topology("v5e:4x4")` gives the 16 compile-only devices of a TPU v5e slice of 4 x 4 chips,
described by libtpu (the `tpu` extra) on any machine, TPU or not; `get_topology("cpu:8")` gives
8 of this process's CPU devices (simulated with `jax_num_cpu_devices` or
`--xla_force_host_platform_device_count`). A step compiled for either with `jax.jit(...).lower`
reports its memory and cost (`tfjax.parallel.costs`) but cannot run.

`CHIPS` holds the datasheet numbers the planner and the benchmark compare against, per chip
(not per device: a v4 or v5p chip in megacore mode is one device, a CPU "chip" is a device);
peaks are bf16 dense (no sparsity). Sources (vendor datasheets and whitepapers):
  * TPU v4: cloud.google.com/tpu/docs/v4 — 275 TFLOP/s bf16, 32 GiB HBM2, 1,200 GB/s.
  * TPU v5e: cloud.google.com/tpu/docs/v5e — 197 TFLOP/s bf16, 16 GB HBM2, 819 GB/s.
  * TPU v5p: cloud.google.com/tpu/docs/v5p — 459 TFLOP/s bf16, 95 GiB HBM2e, 2,765 GB/s.
  * TPU v6e (Trillium): cloud.google.com/tpu/docs/v6e — 918 TFLOP/s bf16, 32 GB, 1,640 GB/s.
  * NVIDIA H100 SXM5: NVIDIA H100 Tensor Core GPU Architecture whitepaper — 989.4 TFLOP/s bf16
    dense (1,978.9 with sparsity); H100 datasheet: 80 GB HBM3, 3.35 TB/s.
  * NVIDIA H100 PCIe: same whitepaper — 756 TFLOP/s bf16 dense; datasheet: 80 GB HBM2e, 2 TB/s.
  * NVIDIA H200 SXM: H200 datasheet — 1,979 TFLOP/s bf16 with sparsity (989.4 dense, the H100's
    compute), 141 GB HBM3e, 4.8 TB/s.
  * NVIDIA A100 SXM4 80GB: nvidia.com/en-us/data-center/a100 datasheet — 312 TFLOP/s bf16
    dense, 80 GB HBM2e, 2,039 GB/s.
The GPUs have no compile-only topology here (that needs the CUDA plugin); `--chip=h100` applies
their numbers to a simulated CPU topology of the same device count.
"""

import dataclasses
import math
import re
from collections.abc import Sequence

import jax

from tfjax import errors

GB, GIB = 1e9, float(2**30)


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip's datasheet numbers (bf16 dense peak, HBM size and bandwidth)."""

    name: str
    device_kinds: tuple[str, ...]  # `jax.Device.device_kind` of its devices, or a part of it
    peak_flops: float  # bf16 FLOP/s, dense
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    chip_config: str = "default"  # libtpu's chip_config_name: v4 and v5p run as megacore


CHIPS = {
    chip.name: chip
    for chip in (
        Chip("v4", ("TPU v4",), 275e12, 32 * GIB, 1200 * GB, "megacore"),
        Chip("v5e", ("TPU v5 lite", "TPU v5e"), 197e12, 16 * GB, 819 * GB),
        Chip("v5p", ("TPU v5", "TPU v5p"), 459e12, 95 * GIB, 2765 * GB, "megacore"),
        Chip("v6e", ("TPU v6 lite", "TPU v6e"), 918e12, 32 * GB, 1640 * GB),
        Chip("h100", ("NVIDIA H100 80GB HBM3", "H100"), 989.4e12, 80 * GB, 3350 * GB),
        Chip("h100_pcie", ("H100 PCIe",), 756e12, 80 * GB, 2000 * GB),
        Chip("h200", ("H200",), 989.4e12, 141 * GB, 4800 * GB),
        Chip("a100", ("NVIDIA A100-SXM4-80GB", "A100"), 312e12, 80 * GB, 2039 * GB),
    )
}
_NAME = re.compile(r"^(?P<generation>[a-z0-9]+):(?P<shape>\d+(x\d+)*)$")


@dataclasses.dataclass(frozen=True)
class Topology:
    """The devices of a slice, and the chip whose datasheet applies (None: not known)."""

    name: str
    devices: tuple[jax.Device, ...]
    chips: int
    chip: Chip | None

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def devices_per_chip(self) -> int:
        return len(self.devices) // self.chips


def chip_of(device_kind: str) -> Chip | None:
    """The chip whose `device_kinds` holds the longest part of `device_kind` ("TPU v5 lite"
    before "TPU v5", "NVIDIA H100 PCIe" is an h100_pcie), or None for a kind not in `CHIPS`."""
    found = [(len(k), c) for c in CHIPS.values() for k in c.device_kinds if k in device_kind]
    return max(found, key=lambda match: match[0])[1] if found else None


def get_chip(name: str) -> Chip:
    """The `CHIPS` entry called `name`.

    Raises:
        tfjax.errors.ConfigError: naming the chips there are.
    """
    if name not in CHIPS:
        raise errors.ConfigError(f"unknown chip {name!r}: choose one of {', '.join(CHIPS)}")
    return CHIPS[name]


def get_topology(name: str, chip: str | None = None) -> Topology:
    """The devices of topology `name`: "cpu:N" (simulated) or a TPU slice "GEN:SHAPE".

    Args:
        name: "cpu:8", or a libtpu topology name such as "v5e:2x2", "v4:2x2x2", "v5p:4x4x4".
        chip: a `CHIPS` name whose datasheet applies instead of the one the name implies; the
            only way to give a CPU topology a chip.

    libtpu loads once per process and takes a machine-wide lock file unless the environment
    has ALLOW_MULTIPLE_LIBTPU_LOAD=1 (compiling touches no TPU; `experiments/plan.py` sets it).

    Raises:
        tfjax.errors.ConfigError: for a malformed or unknown name, or an unknown chip.
        tfjax.errors.DependencyError: for a TPU slice when libtpu is not installed.
        tfjax.errors.UserError: when another process holds libtpu's lock (see above).
    """
    match = _NAME.match(name)
    if not match:
        raise errors.ConfigError(
            f"unknown topology {name!r}: name simulated CPU devices as cpu:N (cpu:8) or a TPU "
            "slice as GENERATION:SHAPE (v5e:2x2, v5e:4x4, v4:2x2x2, v5p:2x2x2, v6e:4x4)"
        )
    generation, shape = match["generation"], match["shape"]
    if generation == "cpu":
        devices = _cpu_devices(int(shape))
        return Topology(name, devices, len(devices), None if chip is None else get_chip(chip))
    if chip is None and generation not in CHIPS:
        raise errors.ConfigError(
            f"unknown chip {generation!r} in topology {name!r}: the chip table has "
            f"{', '.join(CHIPS)}; plan a slice of one of those"
        )
    spec = get_chip(chip or generation)
    # How libtpu lays out the slice is the generation's, whichever datasheet is compared with.
    layout = CHIPS[generation].chip_config if generation in CHIPS else "default"
    devices = _tpu_devices(name, layout)
    _check_device_kind(name, devices, spec, chip)
    return Topology(name, devices, math.prod(int(n) for n in shape.split("x")), spec)


def _cpu_devices(count: int) -> tuple[jax.Device, ...]:
    devices = jax.devices("cpu")
    if not 1 <= count <= len(devices):
        raise errors.ConfigError(
            f"topology cpu:{count} needs {count} CPU devices, this process has {len(devices)}: "
            f"set jax_num_cpu_devices={count} (or XLA_FLAGS="
            f"--xla_force_host_platform_device_count={count}) before JAX starts"
        )
    return tuple(devices[:count])


def _tpu_devices(name: str, chip_config: str) -> tuple[jax.Device, ...]:
    """libtpu's compile-only devices of slice `name` (one per chip, or per core without
    megacore)."""
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(name, "tpu", chip_config_name=chip_config)
    except RuntimeError as error:  # JaxRuntimeError is a RuntimeError too
        text = " ".join(str(error).split())
        if "not installed" in text:
            raise errors.DependencyError(
                f"topology {name!r} needs libtpu, which is not installed: "
                'pip install "tfjax[tpu]" (jax[tpu]: the libtpu of the installed jax)'
            ) from error
        if "lockfile" in text:
            raise errors.UserError(
                f"topology {name!r}: another process on this machine holds libtpu's lock "
                "(/tmp/libtpu_lockfile); compiling needs no TPU: set ALLOW_MULTIPLE_LIBTPU_LOAD=1 "
                "before JAX starts (python -m experiments.plan does)"
            ) from error
        raise errors.ConfigError(f"topology {name!r}: libtpu refuses it: {text}") from error
    return tuple(description.devices)


def _check_device_kind(
    name: str, devices: Sequence[jax.Device], chip: Chip, override: str | None
) -> None:
    kind = devices[0].device_kind
    if override is None and kind not in chip.device_kinds:
        raise errors.ConfigError(
            f"topology {name!r} has devices of kind {kind!r}, not a {chip.name} "
            f"({', '.join(chip.device_kinds)}): pass --chip=NAME to choose the datasheet"
        )
