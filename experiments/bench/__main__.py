"""Benchmarks: `python -m experiments.bench [--bench=train,decode] [--repeats=5] [--peer=torch]`.

Prints one JSON line per sub-benchmark (`train`, `decode`, `attention`, `depth`; see their
modules in `experiments/bench/`). `--bench=depth --repeats=3` compares compile time and memory
of 6 and 24 layers, scanned or not, per remat policy (minutes on a 2-core CPU). `--bench=sweep
--repeats=3` times 8 trials one after another against one vectorised program (`sweep.py`).
`--shape=large --dtype=bfloat16` is the accelerator benchmark;
`--peer=torch` (needs the `parity` extra: `pip install "tfjax[parity]"`) times torch.nn.Transformer
beside tfjax's train step, in alternating pairs; `--peer=flax` times the same model built from
Flax's stock layers (`flax_peer.py`) beside tfjax's train step and its cached greedy decoding.
Where JAX computes on the CPU alone the harness first tunes glibc malloc for the whole process,
both sides included (`tfjax.training.host`;
`host` in the output says so); `--notune_malloc` measures with glibc's defaults.
"""

import json

from absl import flags

from experiments import cli
from experiments.bench import suite, workload
from tfjax.training import host

FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_list("bench", ["train", "decode"], f"Sub-benchmarks to run, from {suite.BENCHES}.")
    flags.DEFINE_integer("repeats", 5, "Timed repeats after the warm-up.")
    flags.DEFINE_integer("warmup", 1, "Untimed calls of each side first (the first compiles).")
    flags.DEFINE_enum(
        "shape", "base", list(workload.SHAPES), "Model and batch shape: base or large."
    )
    flags.DEFINE_integer("batch", None, "Batch size (default: the shape's).")
    flags.DEFINE_string("dtype", "float32", "Compute dtype (bfloat16 on accelerators).")
    flags.DEFINE_enum(
        "attention_impl",
        "auto",
        ["auto", "xla", "cudnn", "reference", "chunked"],
        "ModelConfig.attention_impl of the benchmarked model (cudnn: NVIDIA GPUs, bf16).",
    )
    flags.DEFINE_enum(
        "residual_impl",
        "xla",
        ["xla", "pallas"],
        "ModelConfig.residual_impl of the benchmarked model (pallas: the fused post-LN "
        "residual + dropout + layer norm kernels of tfjax.nn.fused; Triton on NVIDIA GPUs).",
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
        "(default: the datasheet figure of tfjax.parallel.topology.CHIPS when the device is "
        "listed there).",
    )
    flags.DEFINE_float(
        "dropout",
        None,
        "Dropout rate of the benchmarked models, both sides (default: the shape's, 0.1).",
    )
    flags.DEFINE_bool(
        "flatten_optimizer",
        False,
        "Run tfjax's Adam on all parameters raveled into one vector (optax.flatten): one "
        "update over 209M floats instead of one per parameter array.",
    )
    flags.DEFINE_bool(
        "positions",
        False,
        "Give the tfjax batch explicit positions 0..L-1, as packed rows carry: its masks then "
        "stay dense [B, 1, L, S] arrays (with --attention_impl=cudnn, the path before "
        "attention.Lengths: a bias read and its gradient computed in every cuDNN call).",
    )
    flags.DEFINE_string(
        "trace_dir",
        None,
        "After the timed steps, trace 3 more tfjax train steps with jax.profiler into this "
        "folder (a Perfetto trace; `python -m experiments.bench.profile DIR` summarises it).",
    )
    flags.DEFINE_integer(
        "cache_start",
        0,
        "decode: the self-attention cache's first size, doubling as it fills "
        "(tfjax.inference.decoding.cache_phases); 0 = one cache of target_len slots.",
    )
    flags.DEFINE_string(
        "peer", "", f"Framework timed beside tfjax in `train`: '' or one of {suite.PEERS}."
    )
    flags.DEFINE_bool(
        "tune_malloc",
        None,
        "Keep XLA's per-step buffers resident (tfjax.training.host.tune_glibc_malloc) "
        "before anything runs; applies to the whole process, so to the peer too. Default: on "
        "where JAX computes on the CPU alone and the C library is glibc "
        "(tfjax.training.host.should_tune_malloc); --notune_malloc to measure glibc's "
        "defaults. The JSON's host says which.",
    )


def main(argv):
    if host.should_tune_malloc(FLAGS.tune_malloc):
        host.tune_glibc_malloc()  # before the first JAX computation
    cli.no_arguments(argv)
    suite.check_options(FLAGS.bench, FLAGS.peer, FLAGS.warmup)  # one line and status 2 if bad
    results = suite.run(
        FLAGS.bench,
        shape_name=FLAGS.shape,
        batch=FLAGS.batch,
        dtype=FLAGS.dtype,
        repeats=FLAGS.repeats,
        warmup=FLAGS.warmup,
        peer=FLAGS.peer,
        attention_impl=FLAGS.attention_impl,
        peak_flops=FLAGS.peak_flops,
        prng_impl=FLAGS.prng_impl,
        dropout=FLAGS.dropout,
        flatten_optimizer=FLAGS.flatten_optimizer,
        trace_dir=FLAGS.trace_dir,
        residual_impl=FLAGS.residual_impl,
        positions=FLAGS.positions,
        cache_start=FLAGS.cache_start,
    )
    for result in results:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _define_flags()
    cli.main(main, compilation_cache=False)  # it times compilation
