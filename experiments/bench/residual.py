"""The `residual` sub-benchmark: the post-LN step LayerNorm(x + dropout(y)), forward + backward.

One `layers.Residual` (post-LN, the shape's dropout rate, training mode) over the shape's
[B, L, D] activations, with `implementation="xla"` (what XLA fuses by itself) and
`implementation="pallas"` (the fused kernels of `tfjax.nn.fused`), timed in alternating pairs
in one process. Reports each side's seconds per call and the bandwidth of the fused kernels'
minimum traffic (forward: read x, y, write the output and z; backward: read z and the output
gradient, write the gradients of x and y). Made for GPUs; on a CPU the Pallas side runs in
Pallas's interpreter.
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing, workload
from tfjax.nn import layers


def _step(implementation: str, rate: float, dtype: str):
    module = layers.Residual(
        "post", "layernorm", 1e-6, rate, dtype=jnp.dtype(dtype), implementation=implementation
    )

    def loss(params, x, y, weights, key):
        out = module.apply(
            {"params": params}, x, lambda _: y, deterministic=False, rngs={"dropout": key}
        )
        return jnp.sum(out.astype(jnp.float32) * weights)

    return module, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def bench_residual(
    repeats: int, batch: int, dtype: str, shape: dict = workload.SHAPE, warmup: int = 1
) -> dict:
    length, d, rate = shape["target_len"], shape["embed_dim"], shape["dropout_rate"]
    rows = batch * length
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], (batch, length, d), dtype)
    y = jax.random.normal(k[1], (batch, length, d), dtype)
    weights = jax.random.normal(k[2], (batch, length, d), jnp.float32)
    module, xla = _step("xla", rate, dtype)
    params = module.init(k[3], x, lambda _: y)["params"]
    _, pallas = _step("pallas", rate, dtype)

    def run(fn):
        return lambda: jax.block_until_ready(fn(params, x, y, weights, k[3]))

    _, pallas_times, xla_times = timing.time_pairs(run(pallas), run(xla), repeats, warmup)
    moved = 8 * rows * d * jnp.dtype(dtype).itemsize  # 4 arrays each way
    pallas_s, xla_s = statistics.median(pallas_times), statistics.median(xla_times)
    return {
        "bench": "residual",
        "rows": rows,
        "width": d,
        "dropout_rate": rate,
        "pallas_seconds": {"median": pallas_s, "min": min(pallas_times), "max": max(pallas_times)},
        "xla_seconds": {"median": xla_s, "min": min(xla_times), "max": max(xla_times)},
        "speedup_median": xla_s / pallas_s,
        "speedup_per_pair": [a / b for a, b in zip(xla_times, pallas_times, strict=True)],
        "pallas_minimum_bytes": moved,
        "pallas_bandwidth_bytes_per_second": moved / pallas_s,
    }
