"""Benchmarks: `python -m experiments.bench [--bench=train,decode] [--repeats=5] [--peer=torch]`.

Every sub-benchmark prints one JSON line: the shape, tokens/s (median, min, max over repeats
after a warm-up), compile time, peak resident memory of the process, the device allocator's
peak (`device_peak_bytes`, GPU and TPU), and the jax/flax versions and device. `train` adds
model FLOPs per step (formula in the output) and model FLOPs utilisation against the host's
matmul ceiling, which the harness measures itself (a jitted `jnp.dot` of two square arrays in
the compute dtype: 2048 wide on CPU, 8192 on accelerators), and `mfu_vs_peak` against the
device's datasheet peak (`PEAK_FLOPS`, or `--peak_flops`).

`--shape=base` (the default) is the benchmark shape of the project's issues: encoder-decoder,
vocabulary 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, dropout 0.1, batch 32, source
and target length 64, tied embeddings. `--shape=large` is the accelerator shape: the paper's
"big" widths (d_model 1024, d_ff 4096, 16 heads) on 6+6 layers, vocabulary 32000, batch 64,
length 256; run it with `--dtype=bfloat16` (parameters and optimizer state stay float32).
`--attention_impl=cudnn` trains with cuDNN's fused attention on NVIDIA GPUs.

`decode` generates `target_len` tokens per source (EOS disabled so every variant does the same
work): KV-cached greedy, uncached greedy (recomputing the prefix every step) and beam search
with 4 beams. `attention` (not in the default list: about a minute) times forward + backward of
one attention layer (batch 1, 4 heads of 64) for lengths 256 to 8192: full attention, the dense
sliding-window mask (radius 64, still O(L^2)) and the blocked local attention of
`tfjax.nn.attention.local_attention` (O(L * r)), with XLA's temp memory.

`--peer=torch` (needs the `parity` extra: `pip install -e ".[parity]"`) runs PyTorch's
`torch.nn.Transformer`, set up like the tfjax model (`experiments/bench_torch.py`), in the same
process on the same shape and batch (on the GPU when JAX computes on one, under
`torch.autocast` when the dtype is 16-bit), and adds a `peer` object to the `train` line. After
`--warmup` untimed steps of each side (tfjax's first includes compilation), `--repeats` pairs
are timed; each pair times exactly one train step of each side, one call at a time (tfjax's
synchronised with `jax.block_until_ready`, torch's by `loss.item()`), tfjax first in even pairs
and torch first in odd ones so that neither side always runs right after the other. tfjax's
fields are computed from its steps in the pairs; `peer.ratio_per_pair` is tfjax tokens/s /
torch tokens/s of each pair. Both use their default thread pools (torch's count is in
`peer.threads`); on a busy host run with `OMP_WAIT_POLICY=PASSIVE`, or torch's spinning OpenMP
workers can slow its steps 30x (measured on 2 cores shared with a training job: 5.2 s instead
of 0.16 s at batch 2). The torch model has a final LayerNorm on each stack that tfjax's post-LN
model lacks (`peer.notes`), so its `num_params` is 4 * d_model larger. With a peer on a GPU the
harness caps JAX's up-front allocation at 45% of the card (`XLA_PYTHON_CLIENT_MEM_FRACTION`,
unless set) so that torch has room.

Where JAX computes on the CPU alone the harness first tunes glibc malloc for the whole process,
both sides included (`tfjax.training.runtime`; `host_malloc` in the output says so);
`--notune_malloc`
measures with glibc's defaults.
"""

import functools
import json
import os
import resource
import statistics
import sys
import time

from absl import app, flags

from experiments import bench_torch

FLAGS = flags.FLAGS
BENCHES = ("train", "decode", "attention")
PEERS = ("torch",)
ATTENTION_LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
ATTENTION_RADIUS = 64
SHAPE = dict(
    vocab_size=8000,
    embed_dim=256,
    num_layers=3,
    num_decoder_layers=3,
    num_heads=4,
    mlp_dim=1024,
    dropout_rate=0.1,
    batch=32,
    source_len=64,
    target_len=64,
)
# The accelerator shape: the paper's "big" widths (D 1024, F 4096, 16 heads) on 6 + 6 layers,
# a 32k vocabulary (a multiple of 128), batch 64 at length 256.
LARGE_SHAPE = dict(
    vocab_size=32000,
    embed_dim=1024,
    num_layers=6,
    num_decoder_layers=6,
    num_heads=16,
    mlp_dim=4096,
    dropout_rate=0.1,
    batch=64,
    source_len=256,
    target_len=256,
)
SHAPES = {"base": SHAPE, "large": LARGE_SHAPE}
# Datasheet dense (no sparsity) peak FLOP/s by device kind and compute dtype, for
# `mfu_vs_peak`; the first key that is a substring of `jax.Device.device_kind` wins.
# NVIDIA H100 SXM5 and H200: 989.4 TFLOP/s bf16 dense (H100 PCIe: 756); A100: 312;
# Google Cloud TPU v4: 275, v5e: 197, v5p: 459, v6e: 918 (bf16 per chip).
PEAK_FLOPS = {
    "bfloat16": (
        ("H100 PCIe", 756e12),
        ("H100", 989.4e12),
        ("H200", 989.4e12),
        ("A100", 312e12),
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5e", 197e12),
        ("TPU v5", 459e12),
        ("TPU v6 lite", 918e12),
        ("TPU v6e", 918e12),
    ),
}


def _define_flags():
    flags.DEFINE_list("bench", ["train", "decode"], f"Sub-benchmarks to run, from {BENCHES}.")
    flags.DEFINE_integer("repeats", 5, "Timed repeats after the warm-up.")
    flags.DEFINE_integer("warmup", 1, "Untimed calls of each side first (the first compiles).")
    flags.DEFINE_enum("shape", "base", list(SHAPES), "Model and batch shape: base or large.")
    flags.DEFINE_integer("batch", None, "Batch size (default: the shape's).")
    flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 on accelerators).")
    flags.DEFINE_enum(
        "attention_impl",
        "auto",
        ["auto", "xla", "cudnn", "reference"],
        "ModelConfig.attention_impl of the benchmarked model (cudnn: NVIDIA GPUs, bf16).",
    )
    flags.DEFINE_enum(
        "prng_impl",
        None,
        ["threefry2x32", "rbg", "unsafe_rbg"],
        "PRNG implementation of the train step's dropout key (default: JAX's default).",
    )
    flags.DEFINE_float(
        "peak_flops",
        None,
        "The device's peak FLOP/s in the compute dtype, for mfu_vs_peak "
        "(default: the datasheet figure of PEAK_FLOPS when the device is listed there).",
    )
    flags.DEFINE_string(
        "peer", "", f"Framework timed beside tfjax in `train`: '' or one of {PEERS}."
    )
    flags.DEFINE_bool(
        "tune_malloc",
        None,
        "Keep XLA's per-step buffers resident (tfjax.training.runtime.tune_glibc_malloc) before "
        "anything "
        "runs; applies to the whole process, so to the peer too. Default: on where JAX computes "
        "on the CPU alone and the C library is glibc (tfjax.training.runtime.should_tune_malloc); "
        "--notune_malloc to measure glibc's defaults. The JSON's host_malloc says which.",
    )


def _environment() -> dict:
    import flax
    import jax

    from tfjax.training import runtime

    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "device": device.device_kind,
        "platform": device.platform,
        "device_count": jax.device_count(),
        "host_malloc": runtime.malloc_description(),
    }


def _peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _device_peak_bytes() -> int | None:
    """Peak bytes the default device's allocator has held (GPU, TPU); None where not reported."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _time_once(fn) -> float:
    """Seconds of one call of `fn`, waiting for its (jax) outputs."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _warm_up(fn, warmup: int) -> float:
    """Calls `fn` `warmup` times, untimed but for the first (incl. compilation); returns that."""
    first = _time_once(fn)
    for _ in range(warmup - 1):
        _time_once(fn)
    return first


def _time(fn, repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
    """(first call incl. compilation, [seconds per timed call]) after `warmup` untimed calls."""
    first = _warm_up(fn, warmup)
    return first, [_time_once(fn) for _ in range(repeats)]


def _time_pairs(
    fn, peer_fn, repeats: int, warmup: int = 1
) -> tuple[float, list[float], list[float]]:
    """(first `fn` call incl. compilation, [fn seconds], [peer_fn seconds]) over alternating pairs.

    After `warmup` untimed calls of each, pair i times one call of each: `fn` first when i is
    even, `peer_fn` first when i is odd.
    """
    first = _warm_up(fn, warmup)
    _warm_up(peer_fn, warmup)
    times, peer_times = [], []
    for i in range(repeats):
        if i % 2 == 0:
            times.append(_time_once(fn))
            peer_times.append(_time_once(peer_fn))
        else:
            peer_times.append(_time_once(peer_fn))
            times.append(_time_once(fn))
    return first, times, peer_times


def _rates(tokens: float, times: list[float]) -> dict:
    rates = [tokens / t for t in times]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


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
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.dtype(dtype))
    dot = jax.jit(jnp.dot)

    def products():
        for _ in range(calls):
            out = dot(a, a)  # the previous product is freed once this one is queued
        return out

    _, times = _time(products, repeats, warmup=2)
    return 2 * size**3 * calls / statistics.median(times)


def datasheet_peak(device_kind: str, dtype: str) -> float | None:
    """The `PEAK_FLOPS` entry of this device kind and dtype, or None if it has none."""
    for name, flops in PEAK_FLOPS.get(dtype, ()):
        if name in device_kind:
            return flops
    return None


def _model_fields(shape: dict) -> dict:
    return {k: v for k, v in shape.items() if k not in ("batch", "source_len", "target_len")}


def _model(dtype: str, shape: dict = SHAPE, attention_impl: str = "auto"):
    from tfjax import models

    return models.create_model(
        models.ModelConfig(
            **_model_fields(shape),
            max_len=max(512, shape["source_len"], shape["target_len"]),
            dtype=dtype,
            attention_impl=attention_impl,
        )
    )


def _batch(batch: int, shape: dict = SHAPE):
    """Random ids in [3, V) (no padding): "inputs" [B, S], "targets" [B, L], segment ids 1."""
    import numpy as np

    rng = np.random.default_rng(0)
    shape_s, shape_l = (batch, shape["source_len"]), (batch, shape["target_len"])
    return {
        "inputs": rng.integers(3, shape["vocab_size"], shape_s, dtype=np.int32),
        "targets": rng.integers(3, shape["vocab_size"], shape_l, dtype=np.int32),
        "inputs_segment_ids": np.ones(shape_s, np.int32),
        "targets_segment_ids": np.ones(shape_l, np.int32),
    }


def train_flops(batch: int, shape: dict = SHAPE) -> tuple[float, str]:
    """Model FLOPs of one train step (forward + backward = 3 x forward matmul FLOPs)."""
    d, f, v = shape["embed_dim"], shape["mlp_dim"], shape["vocab_size"]
    s, t = shape["source_len"], shape["target_len"]
    enc = shape["num_layers"] * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
    dec = shape["num_decoder_layers"] * (
        2 * t * (4 * d * d + 2 * d * f)
        + 2 * t * 2 * d * d
        + 2 * s * 2 * d * d
        + 4 * t * t * d
        + 4 * t * s * d
    )
    logits = 2 * t * d * v
    formula = (
        "3 * B * [Le*(2S(4D^2+2DF) + 4S^2D) + Ld*(2T(4D^2+2DF) + 2T*2D^2 + 2S*2D^2 + "
        "4T^2D + 4TSD) + 2TDV]  (matmuls only; backward = 2 x forward)"
    )
    return 3.0 * batch * (enc + dec + logits), formula


def _train_step(
    data: dict,
    dtype: str,
    shape: dict = SHAPE,
    attention_impl: str = "auto",
    prng_impl: str | None = None,
):
    """(`run() -> metrics`: one jitted tfjax train step on `data`, parameter count)."""
    import jax

    from tfjax.training import optim, steps

    model = _model(dtype, shape, attention_impl)
    optimizer, schedule = optim.make_optimizer(optim.OptimConfig(), shape["embed_dim"])
    state = steps.create_train_state(model, optimizer, jax.random.key(0), data, "encoder_decoder")
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    step = jax.jit(
        steps.make_train_step(
            model, optimizer, schedule, kind="encoder_decoder", label_smoothing=0.1
        ),
        donate_argnums=(0,),
    )
    holder = {"state": state}
    dropout_key = jax.random.key(1, impl=prng_impl)

    def run():
        holder["state"], metrics = step(holder["state"], data, dropout_key)
        return metrics

    return run, num_params


def _peer_result(
    peer: str, times: list[float], peer_times: list[float], tokens: int, shape: dict, device: str
) -> dict:
    """The `peer` object of the train line (see the module docstring)."""
    del peer  # only "torch" so far
    ratios = [peer_t / t for t, peer_t in zip(times, peer_times, strict=True)]
    return {
        **bench_torch.info(device),
        "num_params": bench_torch.num_params(shape),
        "target_tokens_per_second": _rates(tokens, peer_times),
        "step_seconds_median": statistics.median(peer_times),
        "ratio_per_pair": ratios,
        "ratio_median": statistics.median(ratios),
        "notes": list(bench_torch.NOTES),
    }


def peer_device(platform: str) -> str:
    """Where the torch peer runs: "cuda" when JAX computes on a GPU, else "cpu"."""
    return "cuda" if platform == "gpu" else "cpu"


def bench_train(
    repeats: int,
    batch: int,
    dtype: str,
    peer: str = "",
    shape: dict = SHAPE,
    warmup: int = 1,
    attention_impl: str = "auto",
    peak_flops: float | None = None,
    prng_impl: str | None = None,
) -> dict:
    """Train-step throughput of tfjax; with `peer`, timed in alternation with that framework."""
    import jax

    data = _batch(batch, shape)
    run, num_params = _train_step(data, dtype, shape, attention_impl, prng_impl)
    tokens = batch * shape["target_len"]
    device = jax.devices()[0]
    platform = device.platform
    if peer:
        torch_device = peer_device(platform)
        peer_step = bench_torch.make_train_step(shape, data, device=torch_device, dtype=dtype)
        first, times, peer_times = _time_pairs(run, peer_step, repeats, warmup)
    else:
        first, times = _time(run, repeats, warmup)
    flops, formula = train_flops(batch, shape)
    size = ceiling_size(platform)
    ceiling = matmul_ceiling(size, dtype=dtype, calls=1 if platform == "cpu" else 20)
    median_time = statistics.median(times)
    if peak_flops is None:
        peak_flops = datasheet_peak(device.device_kind, dtype)
    out = {
        "bench": "train",
        "target_tokens_per_second": _rates(tokens, times),
        "step_seconds_median": median_time,
        "compile_seconds": first - median_time,
        "model_flops_per_step": flops,
        "flops_formula": formula,
        "matmul_ceiling_flops": ceiling,
        "matmul_ceiling": f"jitted jnp.dot of two [{size}, {size}] {dtype} arrays",
        "mfu": flops / median_time / ceiling,
        "peak_flops": peak_flops,
        "mfu_vs_peak": None if peak_flops is None else flops / median_time / peak_flops,
        "attention_impl": attention_impl,
        "prng_impl": str(jax.random.key_impl(jax.random.key(0, impl=prng_impl))),
        "num_params": num_params,
    }
    if peer:
        out["peer"] = _peer_result(peer, times, peer_times, tokens, shape, torch_device)
    return out


def bench_decode(repeats: int, batch: int, dtype: str, shape: dict = SHAPE, warmup: int = 1):
    import jax

    from tfjax.inference import beam_search, decoding

    model = _model(dtype, shape)
    data = _batch(batch, shape)
    params = jax.jit(model.init)(jax.random.key(0), data["inputs"], data["targets"])["params"]
    length, src, seg = shape["target_len"], data["inputs"], data["inputs_segment_ids"]
    no_eos = -1  # never produced: every variant generates exactly `length` tokens
    variants = {
        "greedy_cached": jax.jit(
            lambda p: decoding.generate(
                model, p, inputs=src, inputs_segment_ids=seg, max_length=length, eos_id=no_eos
            )
        ),
        "greedy_uncached": jax.jit(
            lambda p: decoding.greedy_decode(
                model, p, src, inputs_segment_ids=seg, max_length=length, eos_id=no_eos
            )
        ),
        "beam4": jax.jit(
            lambda p: beam_search.beam_search(
                model, p, src, inputs_segment_ids=seg, beam_size=4, max_length=length, eos_id=no_eos
            )
        ),
    }
    out = {"bench": "decode", "generated_tokens": batch * length}
    for name, fn in variants.items():
        first, times = _time(lambda fn=fn: fn(params), repeats, warmup)
        out[name] = {
            "generated_tokens_per_second": _rates(batch * length, times),
            "compile_seconds": first - statistics.median(times),
        }
    cached = out["greedy_cached"]["generated_tokens_per_second"]["median"]
    uncached = out["greedy_uncached"]["generated_tokens_per_second"]["median"]
    out["cached_speedup"] = cached / uncached
    return out


def _attention_variant(name: str, length: int):
    """(jitted fwd+bwd function, q, k, v) of one attention layer on [1, L, 4, 64]."""
    import jax
    import jax.numpy as jnp

    from tfjax.nn import attention, masking

    q, k, v = (jax.random.normal(jax.random.key(i), (1, length, 4, 64)) for i in range(3))
    if name == "local_blocked":
        fn = lambda q, k, v: attention.local_attention(q, k, v, radius=ATTENTION_RADIUS)  # noqa: E731
    else:
        mask = masking.window_mask(length, ATTENTION_RADIUS) if name == "window_mask" else None
        fn = lambda q, k, v: attention.dot_product_attention(  # noqa: E731
            q, k, v, mask=mask, implementation="reference"
        )
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2)))
    return grad, q, k, v


def bench_attention(repeats: int, batch: int, dtype: str, warmup: int = 1) -> dict:
    """Forward + backward of one attention layer as the length grows: full, window, blocked."""
    del batch, dtype
    out = {"bench": "attention", "radius": ATTENTION_RADIUS, "heads": 4, "head_dim": 64}
    for name in ("full", "window_mask", "local_blocked"):
        rows = []
        for length in ATTENTION_LENGTHS:
            grad, q, k, v = _attention_variant(name, length)
            memory = grad.lower(q, k, v).compile().memory_analysis()
            _, times = _time(lambda grad=grad, q=q, k=k, v=v: grad(q, k, v), repeats, warmup)
            rows.append(
                {
                    "length": length,
                    "seconds_median": statistics.median(times),
                    "tokens_per_second": _rates(length, times),
                    "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
                }
            )
        out[name] = rows
    return out


def check_peer(peer: str, benches: list[str]) -> None:
    """Raises app.UsageError unless `peer` is '' or one of PEERS, with `train` among `benches`."""
    if peer and peer not in PEERS:
        raise app.UsageError(f"unknown --peer={peer!r}; choose '' (none) or one of {PEERS}")
    if peer and "train" not in benches:
        raise app.UsageError(f"--peer={peer} compares the train bench: add train to --bench")


def main(argv):
    del argv
    from tfjax.training import runtime

    if runtime.should_tune_malloc(FLAGS.tune_malloc):
        runtime.tune_glibc_malloc()  # before the first JAX computation (see tfjax.training.runtime)
    unknown = set(FLAGS.bench) - set(BENCHES)
    if unknown:
        raise app.UsageError(f"unknown --bench {sorted(unknown)}; choose from {BENCHES}")
    check_peer(FLAGS.peer, FLAGS.bench)
    if FLAGS.peer:
        try:
            bench_torch.require_torch()
        except ImportError as error:
            sys.exit(str(error))
    if FLAGS.warmup < 1:
        raise app.UsageError(f"--warmup={FLAGS.warmup}: at least 1 (the first call compiles)")
    model_shape = SHAPES[FLAGS.shape]
    batch = model_shape["batch"] if FLAGS.batch is None else FLAGS.batch
    if FLAGS.peer and "train" in FLAGS.bench:
        # JAX takes 75% of a GPU's memory at start-up; leave the peer room (no effect on CPU).
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    env = _environment()
    shape = {**model_shape, "batch": batch, "dtype": FLAGS.dtype, "name": FLAGS.shape}
    common = dict(shape=model_shape, warmup=FLAGS.warmup)
    runners = {
        "train": functools.partial(
            bench_train,
            peer=FLAGS.peer,
            attention_impl=FLAGS.attention_impl,
            peak_flops=FLAGS.peak_flops,
            prng_impl=FLAGS.prng_impl,
            **common,
        ),
        "decode": functools.partial(bench_decode, **common),
        "attention": functools.partial(bench_attention, warmup=FLAGS.warmup),
    }
    for name in FLAGS.bench:
        result = runners[name](FLAGS.repeats, batch, FLAGS.dtype)
        result.update(
            shape=shape,
            peak_rss_bytes=_peak_rss_bytes(),
            device_peak_bytes=_device_peak_bytes(),
            **env,
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _define_flags()
    app.run(main, argv=sys.argv)
