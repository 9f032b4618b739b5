"""Model FLOPs utilisation (MFU): model FLOPs per step, the matmul ceiling, the datasheet peak.

- `train_flops`: model FLOPs of one train step of the benchmark model (`tfjax.models.flops`).
- `matmul_ceiling`: the FLOP/s the host reaches on a jitted `jnp.dot` of two square arrays in
  the compute dtype (`ceiling_size`: 2048 wide on CPU, 8192 on accelerators), measured.
- `datasheet_peak`: the device's bf16 dense peak FLOP/s from the planner's chip table
  (`tfjax.parallel.topology.CHIPS`; None when not listed).
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing, workload
from tfjax.models import flops
from tfjax.parallel import topology


def train_flops(batch: int, shape: dict) -> float:
    """Model FLOPs of one train step of the benchmark model of `shape` on `batch` rows
    (`tfjax.models.flops.train_flops`, from the parameter shapes; nothing is allocated)."""
    model = workload.create_model("float32", shape)
    rows = {k: jnp.asarray(v) for k, v in workload.random_batch(1, shape).items()}  # one row
    variables = jax.eval_shape(model.init, jax.random.key(0), rows["inputs"], rows["targets"])
    return flops.train_flops(
        model.config,
        variables["params"],
        batch=batch,
        source_len=shape["source_len"],
        target_len=shape["target_len"],
    )


def ceiling_size(platform: str) -> int:
    """Side of the square matmul that measures the ceiling: 2048 on CPU, 8192 on accelerators."""
    return 2048 if platform == "cpu" else 8192


def matmul_ceiling(
    size: int = 2048, repeats: int = 5, dtype: str = "float32", calls: int = 1
) -> float:
    """FLOP/s of a jitted [size, size] @ [size, size] in `dtype` on the default device.

    Each timed repeat dispatches `calls` products back to back and waits for the last, so that
    on an accelerator (an 8192^3 bf16 product is about 1.5 ms on an H100) the host's dispatch
    and wait are not counted as matmul time.
    """
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.dtype(dtype))
    dot = jax.jit(jnp.dot)

    def products():
        for _ in range(calls):
            out = dot(a, a)  # the previous product is freed once this one is queued
        return out

    _, times = timing.time_calls(products, repeats, warmup=2)
    return 2 * size**3 * calls / statistics.median(times)


def datasheet_peak(device_kind: str, dtype: str) -> float | None:
    """The bf16 dense peak FLOP/s of this device kind's chip (`tfjax.parallel.topology.CHIPS`,
    the planner's table); None for another dtype or a kind not in the table."""
    chip = topology.chip_of(device_kind)
    return chip.peak_flops if chip is not None and dtype == "bfloat16" else None
