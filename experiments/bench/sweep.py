"""The `sweep` sub-benchmark: T trials trained one after another against one vectorised program.

For each model in `MODELS` (`cpu`: the shapes of `configs/base.py:cpu` on packed SCAN rows;
`small`: a quarter of its width and one layer each side, where vectorising should pay most) and
T trials that differ in learning rate (`TRIALS`), the same train step (dropout 0.1, label
smoothing 0.1, Adam, the cpu preset's cosine schedule) runs

- sequentially: each trial jits and compiles its own step (its learning rate is a constant of
  its program, as in separate `experiments.train` runs) and runs `steps` steps;
- vectorised: one step vmapped over the trials (`tfjax.training.vectorized`), compiled once,
  `steps` steps, the trials reading one shared batch.

Both sides alternate, `repeats` rounds of (sequential, vectorised) or the reverse. Reported per
side: `trial_steps_per_second` (T x steps / the steps' wall time, compilation excluded;
median, min, max over rounds), `wall_seconds` (compilation included, the whole side: what a
user waits for `steps` steps of every trial) and `compile_seconds` (the first calls). One
device: the trial axis is not sharded here.
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tfjax import models
from tfjax.training import optim, steps, vectorized

TRIALS = 8
MODELS = {
    # configs/base.py:cpu on packed SCAN: vocabulary 23 (rounded up), rows of 32 and 64 tokens
    "cpu": dict(embed_dim=128, num_layers=2, num_decoder_layers=2, num_heads=4, mlp_dim=256),
    "small": dict(embed_dim=32, num_layers=1, num_decoder_layers=1, num_heads=2, mlp_dim=64),
}
VOCAB, SOURCE_LEN, TARGET_LEN, BATCH = 32, 32, 64, 64


def _batch(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "inputs": rng.integers(3, VOCAB, (BATCH, SOURCE_LEN), dtype=np.int32),
        "targets": rng.integers(3, VOCAB, (BATCH, TARGET_LEN), dtype=np.int32),
        "inputs_segment_ids": np.ones((BATCH, SOURCE_LEN), np.int32),
        "targets_segment_ids": np.ones((BATCH, TARGET_LEN), np.int32),
    }


def _optim_configs(trials: int) -> list[optim.OptimConfig]:
    rates = np.geomspace(1e-3, 1.6e-2, trials)
    return [
        optim.OptimConfig(
            schedule="cosine", learning_rate=float(lr), warmup_steps=200, decay_steps=2000
        )
        for lr in rates
    ]


def _model(name: str, dtype: str):
    config = models.ModelConfig(
        **MODELS[name], vocab_size=VOCAB, dropout_rate=0.1, max_len=TARGET_LEN, dtype=dtype
    )
    return models.create_model(config), config


def _sequential(model, config, configs, batch, num_steps: int) -> tuple[float, float, float]:
    """(wall incl. compile, compile seconds, steps' seconds) for the trials one by one."""
    wall, compile_seconds, stepping = time.perf_counter(), 0.0, 0.0
    for index, trial in enumerate(configs):
        optimizer, schedule = optim.make_optimizer(trial, config.embed_dim)
        state = jax.jit(
            lambda key, o=optimizer: steps.create_train_state(model, o, key, batch, config.kind)
        )(jax.random.key(index))
        step = jax.jit(
            steps.make_train_step(
                model, optimizer, schedule, kind=config.kind, label_smoothing=0.1
            ),
            donate_argnums=0,
        )
        start = time.perf_counter()
        state, metrics = step(state, batch, jax.random.key(100 + index))
        jax.block_until_ready(metrics)
        compile_seconds += time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(num_steps):
            state, metrics = step(state, batch, jax.random.key(100 + index))
        jax.block_until_ready(metrics)
        stepping += time.perf_counter() - start
    return time.perf_counter() - wall, compile_seconds, stepping


def _vectorised(model, config, configs, batch, num_steps: int) -> tuple[float, float, float]:
    """(wall incl. compile, compile seconds, steps' seconds) for the trials as one program."""
    wall = time.perf_counter()
    structure = optim.traced_structure(configs)
    hyper = vectorized.stack([optim.traced_hyper(c, structure) for c in configs])
    optimizer, _ = optim.traced_optimizer(vectorized.unstack(hyper, 0), structure, 1)
    keys = jax.random.split(jax.random.key(0), len(configs))
    init = jax.vmap(lambda key: steps.create_train_state(model, optimizer, key, batch, config.kind))
    state = vectorized.SweepState(train=jax.jit(init)(keys), live=jnp.ones(len(configs), bool))
    step = jax.jit(
        vectorized.make_vectorized_train_step(
            model,
            structure,
            d_model=config.embed_dim,
            kind=config.kind,
            label_smoothing=0.1,
            shared_batch=True,
        ),
        donate_argnums=0,
    )
    rngs = jax.random.split(jax.random.key(100), len(configs))
    start = time.perf_counter()
    state, metrics = step(state, batch, rngs, hyper)
    jax.block_until_ready(metrics)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(num_steps):
        state, metrics = step(state, batch, rngs, hyper)
    jax.block_until_ready(metrics)
    stepping = time.perf_counter() - start
    return time.perf_counter() - wall, compile_seconds, stepping


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_sweep(repeats: int, dtype: str, *, trials: int = TRIALS, num_steps: int = 10) -> dict:
    """One result with a row per model: sequential and vectorised sides, alternating."""
    batch = _batch()
    configs = _optim_configs(trials)
    rows = []
    for name in MODELS:
        model, config = _model(name, dtype)
        sides = {"sequential": _sequential, "vectorised": _vectorised}
        runs = {side: [] for side in sides}
        for round_index in range(repeats):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for side in order:
                jax.clear_caches()  # every round compiles, as a fresh sweep would
                runs[side].append(sides[side](model, config, configs, batch, num_steps))
                wall, compiled, stepping = runs[side][-1]
                print(
                    f"sweep bench: {name} {side} round {round_index + 1}: {wall:.1f} s wall, "
                    f"{compiled:.1f} s compiling, {stepping:.2f} s for the steps",
                    file=sys.stderr,
                    flush=True,
                )
        row = {"model": name, **MODELS[name]}
        for side, results in runs.items():
            row[side] = {
                "trial_steps_per_second": _stats([trials * num_steps / r[2] for r in results]),
                "wall_seconds": _stats([r[0] for r in results]),
                "compile_seconds": _stats([r[1] for r in results]),
            }
        seq, vec = row["sequential"], row["vectorised"]
        row["speedup_steps"] = (
            vec["trial_steps_per_second"]["median"] / seq["trial_steps_per_second"]["median"]
        )
        row["speedup_wall"] = seq["wall_seconds"]["median"] / vec["wall_seconds"]["median"]
        rows.append(row)
    return {
        "bench": "sweep",
        "trials": trials,
        "steps_per_trial": num_steps,
        "rounds": repeats,
        "batch": BATCH,
        "lengths": [SOURCE_LEN, TARGET_LEN],
        "shape": {"models": MODELS, "vocab_size": VOCAB, "dtype": dtype},
        "rows": rows,
    }
