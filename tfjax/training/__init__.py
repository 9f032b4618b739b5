"""The pieces of training: steps and state, optimizer, checkpoints, logs, host allocator.

`steps` (TrainState, pure train and eval steps), `mlm` (BERT's masked-LM objective), `optim`
(the optimizer's config and optax chains), `schedules` (learning-rate schedules),
`optax_by_name` (any optax optimizer by name), `muon` (Muon's kernel axes), `mup` (μP's
learning-rate multipliers), `vectorized` (the steps of a vectorised sweep), `population`
(population-based training's exploit and explore on the trial axis), `checkpointing` (orbax,
checksums and fallback), `logger`
(metrics.jsonl, TensorBoard, progress bar), `profiling` (a `jax.profiler` trace of chosen
steps), `host` (host allocator tuning, libtpu on hosts without TPUs) and `storage` (a full or
read-only disk in one line, atomic writes).
The loop that uses them is `tfjax.runs.loop` (a run: `tfjax.runs.trainer`).
"""

from tfjax import _lazy

__all__ = [
    "checkpointing",
    "host",
    "logger",
    "mlm",
    "muon",
    "mup",
    "optax_by_name",
    "optim",
    "population",
    "profiling",
    "schedules",
    "steps",
    "storage",
    "vectorized",
]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
