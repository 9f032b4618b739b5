"""The `train` sub-benchmark: tfjax train-step throughput and MFU, optionally beside a peer.

The line reports target tokens/s (median, min, max over the timed steps), compile time, model
FLOPs per step (`tfjax.models.flops`) and model FLOPs utilisation against the host's measured
matmul ceiling (`mfu`) and against the device's datasheet peak (`mfu_vs_peak`; see `mfu.py`).

With `peer="flax"`, the same model built from Flax's stock layers (`flax_peer.py`) runs in the
same process, jitted, with the same dropout; its first call (compilation) is timed on its own
before the pairs and reported as `peer.compile_seconds`; on the CPU at the base shape,
`alone` trains each side `ALONE_RUNS` times in fresh processes of their own (`rss.py`), in
alternation: peak RSS and lower + compile seconds per process, medians and the compile ratio
(`peak_rss_alone`: the peak RSS medians). With
`peer="torch"`, PyTorch's `torch.nn.Transformer` (`torch_peer.py`) runs in the same process
on the same shape and batch (on the GPU when JAX computes on one, under `torch.autocast` when
the dtype is 16-bit), and the line gets a `peer` object. After `warmup` untimed steps of each
side (tfjax's first includes compilation), `repeats` pairs are timed; each pair times exactly
one train step of each side, one call at a time (tfjax's synchronised with
`jax.block_until_ready`, torch's by `loss.item()`), tfjax first in even pairs and torch first
in odd ones so that neither side always runs right after the other. tfjax's fields are computed
from its steps in the pairs; `peer.ratio_per_pair` is tfjax tokens/s / torch tokens/s of each
pair. Both use their default thread pools (torch's count is in `peer.threads`); on a busy host
run with `OMP_WAIT_POLICY=PASSIVE`, or torch's spinning OpenMP workers can slow its steps
tens of times (docs/performance.md). The torch
model has a final LayerNorm on each stack that tfjax's post-LN model lacks (`peer.notes`), so
its `num_params` is 4 * d_model larger.
"""

import os
import statistics

import jax

from experiments.bench import flax_peer, mfu, rss, timing, torch_peer, workload
from tfjax.training import host

TRACED_STEPS = 3
ALONE_RUNS = 3  # fresh processes per side for peak RSS and compile time alone


def peer_device(platform: str) -> str:
    """Where the torch peer runs: "cuda" when JAX computes on a GPU, else "cpu"."""
    return "cuda" if platform == "gpu" else "cpu"


def _utilisation(
    batch: int,
    shape: dict,
    step_seconds: float,
    device: jax.Device,
    dtype: str,
    peak_flops: float | None,
) -> dict:
    """Model FLOPs per step, the matmul ceiling (measured now) and MFU against it and the peak."""
    flops = mfu.train_flops(batch, shape)
    size = mfu.ceiling_size(device.platform)
    ceiling = mfu.matmul_ceiling(size, dtype=dtype, calls=1 if device.platform == "cpu" else 20)
    if peak_flops is None:
        peak_flops = mfu.datasheet_peak(device.device_kind, dtype)
    return {
        "model_flops_per_step": flops,
        "flops_counted_by": "tfjax.models.flops.train_flops",
        "matmul_ceiling_flops": ceiling,
        "matmul_ceiling": f"jitted jnp.dot of two [{size}, {size}] {dtype} arrays",
        "mfu": flops / step_seconds / ceiling,
        "peak_flops": peak_flops,
        "mfu_vs_peak": None if peak_flops is None else flops / step_seconds / peak_flops,
    }


def _peer_info(peer: str, device: str, shape: dict) -> dict:
    """Name, version, device, parameter count and notes of the peer framework."""
    if peer == "torch":
        return {
            **torch_peer.info(device),
            "num_params": torch_peer.num_params(shape),
            "notes": list(torch_peer.NOTES),
        }
    import flax

    return {
        "name": flax_peer.PEER,
        "version": flax.__version__,
        "device": jax.devices()[0].device_kind,
        "num_params": flax_peer.num_params(shape),
        "dropout": (
            f"rate {shape['dropout_rate']} on embeddings and residual branches on both sides; "
            "none on attention probabilities or feed-forward hidden units"
        ),
        "notes": list(flax_peer.NOTES),
    }


def _peer_result(
    peer: str,
    first: float,
    times: list[float],
    peer_times: list[float],
    tokens: int,
    shape: dict,
    device: str,
) -> dict:
    """The `peer` object of the train line (see the module docstring)."""
    ratios = [peer_t / t for t, peer_t in zip(times, peer_times, strict=True)]
    median = statistics.median(peer_times)
    return {
        **_peer_info(peer, device, shape),
        "target_tokens_per_second": timing.rates(tokens, peer_times),
        "step_seconds_median": median,
        "compile_seconds": first - median,
        "ratio_per_pair": ratios,
        "ratio_median": statistics.median(ratios),
    }


def _peer_step(peer: str, shape: dict, data: dict, device: str, dtype: str):
    if peer == "torch":
        return torch_peer.make_train_step(shape, data, device=device, dtype=dtype)
    return flax_peer.make_train_step(shape, data, dtype=dtype)


def bench_train(
    repeats: int,
    batch: int,
    dtype: str,
    peer: str = "",
    shape: dict = workload.SHAPE,
    warmup: int = 1,
    attention_impl: str = "auto",
    peak_flops: float | None = None,
    prng_impl: str | None = None,
    flatten_optimizer: bool = False,
    trace_dir: str | None = None,
    residual_impl: str = "xla",
    positions: bool = False,
) -> dict:
    """Train-step throughput of tfjax; with `peer`, timed in alternation with that framework.

    `flatten_optimizer` runs tfjax's Adam on one raveled vector (`workload.make_train_step`);
    `trace_dir` traces `TRACED_STEPS` more tfjax steps with `jax.profiler` after the timing
    (with `peer="flax"` into `trace_dir`/tfjax, then as many Flax steps into `trace_dir`/flax);
    `positions` gives tfjax's batch explicit positions (`workload.with_positions`), which
    keeps its masks dense.
    """
    data = workload.random_batch(batch, shape)
    run, num_params = workload.make_train_step(
        workload.with_positions(data) if positions else data,
        dtype,
        shape,
        attention_impl,
        prng_impl,
        flatten_optimizer=flatten_optimizer,
        residual_impl=residual_impl,
    )
    tokens = batch * shape["target_len"]
    device = jax.devices()[0]
    if peer:
        peer_where = peer_device(device.platform)
        peer_step = _peer_step(peer, shape, data, peer_where, dtype)
        peer_first = timing.time_once(peer_step)  # compilation (flax) or first-call overhead
        first, times, peer_times = timing.time_pairs(run, peer_step, repeats, warmup)
    else:
        first, times = timing.time_calls(run, repeats, warmup)
    if trace_dir:
        traced = {"": run} if peer != "flax" else {"tfjax": run, "flax": peer_step}
        for name, fn in traced.items():  # with the Flax peer: DIR/tfjax, then DIR/flax
            with jax.profiler.trace(os.path.join(trace_dir, name), create_perfetto_trace=True):
                for _ in range(TRACED_STEPS):
                    jax.block_until_ready(fn())
    median_time = statistics.median(times)
    out = {
        "bench": "train",
        "target_tokens_per_second": timing.rates(tokens, times),
        "step_seconds_median": median_time,
        "compile_seconds": first - median_time,
        **_utilisation(batch, shape, median_time, device, dtype, peak_flops),
        "attention_impl": attention_impl,
        "residual_impl": residual_impl,
        "masks": "dense (positions given)" if positions else "by the model (no positions)",
        "prng_impl": str(jax.random.key_impl(jax.random.key(0, impl=prng_impl))),
        "num_params": num_params,
        "optimizer": "adam on one raveled vector" if flatten_optimizer else "adam per array",
        "dropout_rate": shape["dropout_rate"],
    }
    if trace_dir:
        out["trace_dir"] = trace_dir
    if peer:
        out["peer"] = _peer_result(peer, peer_first, times, peer_times, tokens, shape, peer_where)
    if peer == "flax" and shape is workload.SHAPE and device.platform == "cpu":
        tuned = host.malloc_description().endswith(", tuned")
        out["alone"] = alone_runs(batch, tuned, dtype)
        out["peak_rss_alone"] = {side: out["alone"][side]["peak_rss_median"] for side in rss.SIDES}
    return out


def alone_runs(batch: int, tune_malloc: bool, dtype: str, runs: int = ALONE_RUNS) -> dict:
    """Each side trained `runs` times in a fresh process of its own (`rss.alone`), the sides
    alternating and taking turns to go first: per side the peak RSS and the lower + compile
    seconds of every process and their medians, and `compile_ratio` (Flax's median / tfjax's:
    above 1 when tfjax compiles faster). Peak RSS falls into modes on both sides with the
    allocator tuned (docs/performance.md), hence every process's figure."""
    lines: dict[str, list[dict]] = {side: [] for side in rss.SIDES}
    for i in range(runs):
        for side in rss.SIDES if i % 2 == 0 else rss.SIDES[::-1]:
            lines[side].append(rss.alone(side, batch=batch, tune_malloc=tune_malloc, dtype=dtype))
    out: dict = {"runs": runs}
    for side, found in lines.items():
        peaks = [line["peak_rss_bytes"] for line in found]
        seconds = [line["lower_seconds"] + line["compile_seconds"] for line in found]
        out[side] = {
            "peak_rss_bytes": peaks,
            "peak_rss_median": statistics.median(peaks),
            "lower_compile_seconds": seconds,
            "lower_compile_median": statistics.median(seconds),
        }
    out["compile_ratio"] = (
        out["flax"]["lower_compile_median"] / out["tfjax"]["lower_compile_median"]
    )
    return out
