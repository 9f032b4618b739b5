"""The two data-parallel modes side by side: `parallel.mode="pmap"` against `"sharded"`.

Builds the run of `CONFIG` (the README's first recipe) once per mode with `tfjax.runs.build`,
exactly as `experiments.train` does, on all local devices, and times the compiled train steps
in alternating pairs on one training batch (`timing.time_pairs`). `sharded` with fsdp = tensor
= 1 is plain data parallelism under `jax.jit` with `NamedSharding`s. The line reports each
mode's target tokens/s, step seconds and compile seconds (first call minus the median), and
`sharded_over_pmap`, the ratio of the median step times (below 1: sharded is faster).
"""

import pathlib
import statistics
import tempfile

import jax

from experiments import config_utils
from experiments.bench import timing
from tfjax.runs import build
from tfjax.training import steps

CONFIG = "configs/base.py:cpu"
MODES = ("pmap", "sharded")


def _step_of(mode: str, workdir: str, batch_size: int | None, spec: str = CONFIG):
    """(a closure that runs one train step and carries the state, target tokens per step,
    the recipe's shape)."""
    overrides = [f"parallel.mode={mode}"]
    if batch_size:
        overrides.append(f"train.global_batch_size={batch_size}")
    config = config_utils.load_config(spec, overrides)
    run = build.build(config, pathlib.Path(workdir))
    batch = next(iter(build.train_iterator(run)))
    sample = jax.tree.map(lambda x: jax.numpy.asarray(x[None]), run.examples.train[0])
    init_rng, rng = jax.random.split(jax.random.key(config.seed))
    state = jax.jit(
        lambda key: steps.create_train_state(
            run.model, run.optimizer, key, sample, run.model_config.kind
        )
    )(init_rng)
    carried = {"state": run.strategy.put_state(state)}
    placed = run.strategy.put_batch(batch)

    def one_step():
        carried["state"], metrics = run.train_step(carried["state"], placed, rng)
        return metrics

    shape = {
        "config": spec,
        "global_batch_size": config.train.global_batch_size,
        **{key: config.model[key] for key in ("embed_dim", "num_layers", "num_heads", "mlp_dim")},
    }
    return one_step, int(batch["targets"].size), shape


def bench_parallel(
    repeats: int, batch: int | None, dtype: str, warmup: int = 1, spec: str = CONFIG
) -> dict:
    """Train-step throughput of the recipe `spec` under each mode of `MODES`, in alternating
    pairs (`batch`: its global batch size, None = the recipe's)."""
    del dtype  # the recipe's own
    out = {"bench": "parallel", "config": spec, "devices": jax.local_device_count()}
    with tempfile.TemporaryDirectory() as pmap_dir, tempfile.TemporaryDirectory() as jit_dir:
        pmap_step, tokens, out["shape"] = _step_of("pmap", pmap_dir, batch, spec)
        sharded_step, _, _ = _step_of("sharded", jit_dir, batch, spec)
        firsts = [timing.time_once(pmap_step), timing.time_once(sharded_step)]  # compiles
        _, pmap_times, sharded_times = timing.time_pairs(pmap_step, sharded_step, repeats, warmup)
    for mode, first, times in zip(MODES, firsts, (pmap_times, sharded_times), strict=True):
        median = statistics.median(times)
        out[mode] = {
            "target_tokens_per_second": timing.rates(tokens, times),
            "step_seconds_median": median,
            "compile_seconds": first - median,
        }
    ratio = out["sharded"]["step_seconds_median"] / out["pmap"]["step_seconds_median"]
    out["sharded_over_pmap"] = ratio
    return out
