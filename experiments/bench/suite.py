"""The sub-benchmarks by name: option checks, and one result dict per sub-benchmark run.

Every result gets the same trailing fields: the shape (with batch, dtype and shape name; the
`depth` bench reports its own narrow model instead, see `depth.DEPTH_SHAPE`), the
process's peak resident memory, the device allocator's peak (`device_peak_bytes`, GPU and TPU)
and the environment (`environment.describe`: jax/flax versions, device, allocator).
"""

import functools
import os
from collections.abc import Iterator

from experiments import cli
from experiments.bench import (
    attention,
    decode,
    depth,
    environment,
    parallel,
    residual,
    sweep,
    torch_peer,
    train,
    workload,
)

BENCHES = ("train", "decode", "attention", "depth", "sweep", "residual", "parallel")
PEERS = ("torch", "flax")


def check_peer(peer: str, benches: list[str]) -> None:
    """Raises cli.UsageError unless `peer` is '' or one of PEERS, with a bench it compares."""
    if peer and peer not in PEERS:
        raise cli.UsageError(f"unknown --peer={peer!r}; choose '' (none) or one of {PEERS}")
    if peer == "torch" and "train" not in benches:
        raise cli.UsageError(f"--peer={peer} compares the train bench: add train to --bench")
    if peer == "flax" and not {"train", "decode"} & set(benches):
        raise cli.UsageError(
            f"--peer={peer} compares the train and decode benches: add one to --bench"
        )


def check_options(benches: list[str], peer: str, warmup: int) -> None:
    """Raises cli.UsageError for an unknown bench or peer or warmup < 1, in that order.

    Raises:
      cli.UsageError: as above.
      tfjax.errors.DependencyError: (before the warmup check) when `peer` is set and torch is
        not installed.
    """
    unknown = set(benches) - set(BENCHES)
    if unknown:
        raise cli.UsageError(f"unknown --bench {sorted(unknown)}; choose from {BENCHES}")
    check_peer(peer, benches)
    if peer == "torch":
        torch_peer.require_torch()
    if warmup < 1:
        raise cli.UsageError(f"--warmup={warmup}: at least 1 (the first call compiles)")


def run(
    benches: list[str],
    *,
    shape_name: str,
    batch: int | None,
    dtype: str,
    repeats: int,
    warmup: int,
    peer: str = "",
    attention_impl: str = "auto",
    peak_flops: float | None = None,
    prng_impl: str | None = None,
    dropout: float | None = None,
    flatten_optimizer: bool = False,
    trace_dir: str | None = None,
    residual_impl: str = "xla",
    positions: bool = False,
    cache_start: int = 0,
) -> Iterator[dict]:
    """Runs `benches` in order, yielding each one's result as soon as it is complete.

    Args:
      benches: names from BENCHES.
      shape_name: a key of `workload.SHAPES`.
      batch: batch size; None = the shape's.
      dtype: compute dtype.
      repeats, warmup: timed and untimed calls per measurement.
      peer, attention_impl, peak_flops, prng_impl, flatten_optimizer, trace_dir,
        residual_impl, positions: options of `train.bench_train`.
      dropout: the models' dropout rate, both sides (None: the shape's).
      cache_start: the decode bench's `decoding.generate` / `beam_search` option.
    """
    model_shape = workload.SHAPES[shape_name]
    if cache_start < 0:
        raise cli.UsageError(f"--cache_start={cache_start}: expected 0 (off) or a slot count")
    if dropout is not None:
        if not 0.0 <= dropout < 1.0:
            raise cli.UsageError(f"--dropout={dropout}: expected a rate in [0, 1)")
        model_shape = {**model_shape, "dropout_rate": dropout}
    requested_batch = batch  # the depth bench has its own default
    batch = model_shape["batch"] if batch is None else batch
    if peer and "train" in benches:
        # JAX takes 75% of a GPU's memory at start-up; leave the peer room (no effect on CPU).
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")
    env = environment.describe()  # initialises JAX's backends: after the memory fraction
    shape = {**model_shape, "batch": batch, "dtype": dtype, "name": shape_name}
    common = dict(shape=model_shape, warmup=warmup)
    runners = {
        "train": functools.partial(
            train.bench_train,
            peer=peer,
            attention_impl=attention_impl,
            peak_flops=peak_flops,
            prng_impl=prng_impl,
            flatten_optimizer=flatten_optimizer,
            trace_dir=trace_dir,
            residual_impl=residual_impl,
            positions=positions,
            **common,
        ),
        "decode": functools.partial(
            decode.bench_decode, peer=peer, cache_start=cache_start, **common
        ),
        "attention": functools.partial(attention.bench_attention, warmup=warmup),
        "depth": lambda repeats, _, dtype: depth.bench_depth(
            repeats, requested_batch, dtype, warmup=warmup
        ),
        "sweep": lambda repeats, _, dtype: sweep.bench_sweep(repeats, dtype),
        "residual": functools.partial(residual.bench_residual, **common),
        "parallel": lambda repeats, _, dtype: parallel.bench_parallel(
            repeats, requested_batch, dtype, warmup=warmup
        ),
    }
    for name in benches:
        result = runners[name](repeats, batch, dtype)
        result.setdefault("shape", shape)
        result.update(
            peak_rss_bytes=environment.peak_rss_bytes(),
            device_peak_bytes=environment.device_peak_bytes(),
            **env,
        )
        yield result
