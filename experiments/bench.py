"""Benchmarks: `python -m experiments.bench [--bench=train,decode] [--repeats=5] [--peer=torch]`.

Every sub-benchmark prints one JSON line: the shape, tokens/s (median, min, max over repeats
after a warm-up), compile time, peak resident memory of the process, and the jax/flax versions
and device. `train` adds model FLOPs per step (formula in the output) and model FLOPs
utilisation against the host's matmul ceiling, which the harness measures itself (a jitted
float32 `jnp.dot`).

The default shape is the benchmark shape of the project's issues: encoder-decoder, vocabulary
8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, dropout 0.1, batch 32, source and target
length 64, tied embeddings. `decode` generates 64 tokens per source (EOS disabled so every
variant does the same work): KV-cached greedy, uncached greedy (recomputing the prefix every
step) and beam search with 4 beams. `attention` (not in the default list: about a minute)
times forward + backward of one attention layer (batch 1, 4 heads of 64) for lengths 256 to
8192: full attention, the dense sliding-window mask (radius 64, still O(L^2)) and the blocked
local attention of `tfjax.attention.local_attention` (O(L * r)), with XLA's temp memory.

`--peer=torch` (needs the `parity` extra: `pip install -e ".[parity]"`) runs PyTorch's
`torch.nn.Transformer`, set up like the tfjax model (`experiments/bench_torch.py`), in the same
process on the same shape and batch, and adds a `peer` object to the `train` line. After one
warm-up step of each side (tfjax's includes compilation), `--repeats` pairs are timed; each
pair times exactly one train step of each side, one call at a time (tfjax's synchronised with
`jax.block_until_ready`, torch's by `loss.item()`), tfjax first in even pairs and torch first
in odd ones so that neither side always runs right after the other. tfjax's fields are computed
from its steps in the pairs; `peer.ratio_per_pair` is tfjax tokens/s / torch tokens/s of each
pair. Both use their default thread pools (torch's count is in `peer.threads`); on a busy host
run with `OMP_WAIT_POLICY=PASSIVE`, or torch's spinning OpenMP workers can slow its steps 30x
(measured on 2 cores shared with a training job: 5.2 s instead of 0.16 s at batch 2). The torch
model has a final LayerNorm on each stack that tfjax's post-LN model lacks (`peer.notes`), so
its `num_params` is 4 * d_model larger.

Where JAX computes on the CPU alone the harness first tunes glibc malloc for the whole process,
both sides included (`tfjax.runtime`; `host_malloc` in the output says so); `--notune_malloc`
measures with glibc's defaults.
"""

import functools
import json
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


def _define_flags():
    flags.DEFINE_list("bench", ["train", "decode"], f"Sub-benchmarks to run, from {BENCHES}.")
    flags.DEFINE_integer("repeats", 5, "Timed repeats after one warm-up.")
    flags.DEFINE_integer("batch", SHAPE["batch"], "Batch size.")
    flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 on accelerators).")
    flags.DEFINE_string(
        "peer", "", f"Framework timed beside tfjax in `train`: '' or one of {PEERS}."
    )
    flags.DEFINE_bool(
        "tune_malloc",
        None,
        "Keep XLA's per-step buffers resident (tfjax.runtime.tune_glibc_malloc) before anything "
        "runs; applies to the whole process, so to the peer too. Default: on where JAX computes "
        "on the CPU alone and the C library is glibc (tfjax.runtime.should_tune_malloc); "
        "--notune_malloc to measure glibc's defaults. The JSON's host_malloc says which.",
    )


def _environment() -> dict:
    import flax
    import jax

    from tfjax import runtime

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


def _time_once(fn) -> float:
    """Seconds of one call of `fn`, waiting for its (jax) outputs."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _time(fn, repeats: int) -> tuple[float, list[float]]:
    """(first call incl. compilation, [seconds per timed call])."""
    first = _time_once(fn)
    return first, [_time_once(fn) for _ in range(repeats)]


def _time_pairs(fn, peer_fn, repeats: int) -> tuple[float, list[float], list[float]]:
    """(first `fn` call incl. compilation, [fn seconds], [peer_fn seconds]) over alternating pairs.

    After one warm-up call of each, pair i times one call of each: `fn` first when i is even,
    `peer_fn` first when i is odd.
    """
    first = _time_once(fn)
    _time_once(peer_fn)
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


def matmul_ceiling(size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a jitted float32 [size, size] @ [size, size] on the default device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    dot = jax.jit(jnp.dot)
    _, times = _time(lambda: dot(a, a), repeats)
    return 2 * size**3 / statistics.median(times)


def _model(dtype: str):
    from tfjax import models

    fields = {k: v for k, v in SHAPE.items() if k not in ("batch", "source_len", "target_len")}
    return models.create_model(models.ModelConfig(**fields, dtype=dtype))


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


def train_flops(batch: int) -> tuple[float, str]:
    """Model FLOPs of one train step (forward + backward = 3 x forward matmul FLOPs)."""
    d, f, v = SHAPE["embed_dim"], SHAPE["mlp_dim"], SHAPE["vocab_size"]
    s, t = SHAPE["source_len"], SHAPE["target_len"]
    enc = SHAPE["num_layers"] * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
    dec = SHAPE["num_decoder_layers"] * (
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


def _train_step(data: dict, dtype: str):
    """(`run() -> metrics`: one jitted tfjax train step on `data`, parameter count)."""
    import jax

    from tfjax import optim, training

    model = _model(dtype)
    optimizer, schedule = optim.make_optimizer(optim.OptimConfig(), SHAPE["embed_dim"])
    state = training.create_train_state(
        model, optimizer, jax.random.key(0), data, "encoder_decoder"
    )
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    step = jax.jit(
        training.make_train_step(
            model, optimizer, schedule, kind="encoder_decoder", label_smoothing=0.1
        ),
        donate_argnums=(0,),
    )
    holder = {"state": state}

    def run():
        holder["state"], metrics = step(holder["state"], data, jax.random.key(1))
        return metrics

    return run, num_params


def _peer_result(peer: str, times: list[float], peer_times: list[float], tokens: int) -> dict:
    """The `peer` object of the train line (see the module docstring)."""
    del peer  # only "torch" so far
    ratios = [peer_t / t for t, peer_t in zip(times, peer_times, strict=True)]
    return {
        **bench_torch.info(),
        "num_params": bench_torch.num_params(SHAPE),
        "target_tokens_per_second": _rates(tokens, peer_times),
        "step_seconds_median": statistics.median(peer_times),
        "ratio_per_pair": ratios,
        "ratio_median": statistics.median(ratios),
        "notes": list(bench_torch.NOTES),
    }


def bench_train(repeats: int, batch: int, dtype: str, peer: str = "") -> dict:
    """Train-step throughput of tfjax; with `peer`, timed in alternation with that framework."""
    data = _batch(batch)
    run, num_params = _train_step(data, dtype)
    tokens = batch * SHAPE["target_len"]
    if peer:
        peer_step = bench_torch.make_train_step(SHAPE, data)
        first, times, peer_times = _time_pairs(run, peer_step, repeats)
    else:
        first, times = _time(run, repeats)
    flops, formula = train_flops(batch)
    ceiling = matmul_ceiling()
    median_time = statistics.median(times)
    out = {
        "bench": "train",
        "target_tokens_per_second": _rates(tokens, times),
        "step_seconds_median": median_time,
        "compile_seconds": first - median_time,
        "model_flops_per_step": flops,
        "flops_formula": formula,
        "matmul_ceiling_flops": ceiling,
        "mfu": flops / median_time / ceiling,
        "num_params": num_params,
    }
    if peer:
        out["peer"] = _peer_result(peer, times, peer_times, tokens)
    return out


def bench_decode(repeats: int, batch: int, dtype: str) -> dict:
    import jax

    from tfjax import beam_search, decoding

    model = _model(dtype)
    data = _batch(batch)
    params = jax.jit(model.init)(jax.random.key(0), data["inputs"], data["targets"])["params"]
    length, src, seg = SHAPE["target_len"], data["inputs"], data["inputs_segment_ids"]
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
        first, times = _time(lambda fn=fn: fn(params), repeats)
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

    from tfjax import attention, masking

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


def bench_attention(repeats: int, batch: int, dtype: str) -> dict:
    """Forward + backward of one attention layer as the length grows: full, window, blocked."""
    del batch, dtype
    out = {"bench": "attention", "radius": ATTENTION_RADIUS, "heads": 4, "head_dim": 64}
    for name in ("full", "window_mask", "local_blocked"):
        rows = []
        for length in ATTENTION_LENGTHS:
            grad, q, k, v = _attention_variant(name, length)
            memory = grad.lower(q, k, v).compile().memory_analysis()
            _, times = _time(lambda grad=grad, q=q, k=k, v=v: grad(q, k, v), repeats)
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
    from tfjax import runtime

    if runtime.should_tune_malloc(FLAGS.tune_malloc):
        runtime.tune_glibc_malloc()  # before the first JAX computation (see tfjax.runtime)
    unknown = set(FLAGS.bench) - set(BENCHES)
    if unknown:
        raise app.UsageError(f"unknown --bench {sorted(unknown)}; choose from {BENCHES}")
    check_peer(FLAGS.peer, FLAGS.bench)
    if FLAGS.peer:
        try:
            bench_torch.require_torch()
        except ImportError as error:
            sys.exit(str(error))
    env = _environment()
    shape = {**SHAPE, "batch": FLAGS.batch, "dtype": FLAGS.dtype}
    runners = {
        "train": functools.partial(bench_train, peer=FLAGS.peer),
        "decode": bench_decode,
        "attention": bench_attention,
    }
    for name in FLAGS.bench:
        result = runners[name](FLAGS.repeats, FLAGS.batch, FLAGS.dtype)
        result.update(shape=shape, peak_rss_bytes=_peak_rss_bytes(), **env)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _define_flags()
    app.run(main, argv=sys.argv)
