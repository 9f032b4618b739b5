"""The `depth` sub-benchmark: compile time and memory of deep models, scanned or not, per remat.

For 6 and 24 layers (`DEPTHS`), unscanned and scanned (`ModelConfig.scan_layers`), and each
`ModelConfig.remat` policy, the train step (forward, backward, Adam) of a narrow decoder-only
model (`DEPTH_SHAPE`: D 64, 4 heads, F 256, batch 8, length 128) is

- traced and lowered to StableHLO (`lower_seconds`), then compiled by XLA (`compile_seconds`),
  `compiles` times with JAX's caches cleared in between (medians). Wall time and this process's
  CPU time (`*_cpu_seconds`: XLA compiles on one thread, so CPU time is the steadier figure on
  a host shared with other jobs; `load_average` says how busy it was);
- read back from XLA's buffer assignment (`memory_analysis()`): `temp_bytes` (activations kept
  for the backward pass, and scratch) and `peak_bytes` = arguments + outputs - aliased + temp
  (parameters, optimizer state and batch included; the donated state is aliased). XLA's own
  `peak_memory_in_bytes` is not used: on CPU it counts the arguments only;
- run: the median, min and max seconds of `repeats` train steps after `warmup` (remat's
  recomputation shows here).

Narrow, so that 16 compilations fit in minutes on a 2-core CPU: what grows with depth here is
the program, not the matmuls. Printed as one JSON line with one row per configuration.
"""

import os
import statistics
import time

import jax
import numpy as np

from experiments.bench import timing
from tfjax import models
from tfjax.nn import stacking
from tfjax.training import optim, steps

DEPTHS = (6, 24)
DEPTH_SHAPE = dict(
    vocab_size=1024,
    embed_dim=64,
    num_heads=4,
    mlp_dim=256,
    dropout_rate=0.1,
    batch=8,
    target_len=128,
)


def _setup(num_layers: int, scan: bool, remat: str, batch: int, dtype: str, shape: dict):
    """(jitted train step, state, batch, rng) of the depth model with these settings."""
    fields = {k: v for k, v in shape.items() if k not in ("batch", "target_len")}
    length = shape["target_len"]
    config = models.ModelConfig(
        **fields,
        kind="decoder_only",
        num_layers=num_layers,
        max_len=length,
        dtype=dtype,
        scan_layers=scan,
        remat=remat,
    )
    model = models.create_model(config)
    optimizer, schedule = optim.make_optimizer(optim.OptimConfig(), config.embed_dim)
    rng = np.random.default_rng(0)
    data = {
        "targets": rng.integers(3, config.vocab_size, (batch, length), dtype=np.int32),
        "targets_segment_ids": np.ones((batch, length), np.int32),
    }
    state = jax.jit(
        lambda key: steps.create_train_state(model, optimizer, key, data, "decoder_only")
    )(jax.random.key(0))
    step = steps.make_train_step(
        model, optimizer, schedule, kind="decoder_only", label_smoothing=0.1
    )
    return jax.jit(step, donate_argnums=(0,)), state, data, jax.random.key(1)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _compile_once(step, state, data, rng) -> tuple[dict, object]:
    """({lower/compile wall and CPU seconds}, compiled) from cold caches."""
    jax.clear_caches()
    start = _clocks()
    lowered = step.lower(state, data, rng)
    lowered_at = _clocks()
    compiled = lowered.compile()
    end = _clocks()
    return {
        "lower_seconds": lowered_at[0] - start[0],
        "lower_cpu_seconds": lowered_at[1] - start[1],
        "compile_seconds": end[0] - lowered_at[0],
        "compile_cpu_seconds": end[1] - lowered_at[1],
    }, compiled


def _memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    live = stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
    return {
        "temp_bytes": stats.temp_size_in_bytes,
        "peak_bytes": live + stats.temp_size_in_bytes,
        "argument_bytes": stats.argument_size_in_bytes,
    }


def _row(num_layers: int, scan: bool, remat: str, *, compiles: int, timed: dict, **setup) -> dict:
    """One configuration's figures (see the module docstring)."""
    step, state, data, rng = _setup(num_layers, scan, remat, **setup)
    runs = [_compile_once(step, state, data, rng) for _ in range(compiles)]
    compiled = runs[-1][1]
    holder = {"state": state}

    def run():
        holder["state"], metrics = compiled(holder["state"], data, rng)
        return metrics

    _, times = timing.time_calls(run, timed["repeats"], timed["warmup"])
    clocks = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    return {
        "num_layers": num_layers,
        "scan_layers": scan,
        "remat": remat,
        **clocks,
        "compile_seconds_all": [r[0]["compile_seconds"] for r in runs],
        **_memory(compiled),
        "step_seconds_median": statistics.median(times),
        "step_seconds_min": min(times),
        "step_seconds_max": max(times),
    }


def bench_depth(
    repeats: int,
    batch: int | None,
    dtype: str,
    warmup: int = 1,
    compiles: int = 1,
    depths: tuple[int, ...] = DEPTHS,
    policies: tuple[str, ...] = stacking.REMAT_POLICIES,
    shape: dict = DEPTH_SHAPE,
) -> dict:
    """Compile time and memory per depth, layout and remat policy (see the module docstring).

    Args:
      repeats, warmup: timed and untimed train steps per configuration.
      batch: the batch size; None = the shape's.
      dtype: compute dtype.
      compiles: cold compilations per configuration (medians reported).
      depths, policies: what to sweep.
      shape: `DEPTH_SHAPE`'s fields (tests pass a smaller one).
    """
    batch = shape["batch"] if batch is None else batch
    setup = dict(batch=batch, dtype=dtype, shape=shape)
    timed = dict(repeats=repeats, warmup=warmup)
    rows = [
        _row(n, scan, remat, compiles=compiles, timed=timed, **setup)
        for n in depths
        for scan in (False, True)
        for remat in policies
    ]
    return {
        "bench": "depth",
        "rows": rows,
        "compiles": compiles,
        "load_average": os.getloadavg(),  # other jobs on the host slow the wall-clock figures
        "shape": {**shape, "batch": batch, "dtype": dtype, "kind": "decoder_only"},
    }


def markdown_table(result: dict) -> str:
    """docs/performance.md's table of a `bench_depth` result: one line per configuration."""
    lines = [
        "| layers | scan | remat | trace+lower s (CPU) | XLA compile s (CPU) | temp MiB "
        "| peak MiB | step s, median (min-max) |",
        "|---:|:---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['num_layers']} | {'yes' if r['scan_layers'] else 'no'} | {r['remat']} "
            f"| {r['lower_seconds']:.1f} ({r['lower_cpu_seconds']:.1f}) "
            f"| {r['compile_seconds']:.1f} ({r['compile_cpu_seconds']:.1f}) "
            f"| {r['temp_bytes'] / 2**20:.1f} | {r['peak_bytes'] / 2**20:.1f} "
            f"| {r['step_seconds_median']:.3f} "
            f"({r['step_seconds_min']:.3f}-{r['step_seconds_max']:.3f}) |"
        )
    return "\n".join(lines)
