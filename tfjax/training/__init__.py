"""The pieces of training: steps and state, optimizer, checkpoints, logs, host runtime.

`steps` (TrainState, pure train and eval steps), `mlm` (BERT's masked-LM objective), `optim`
(schedules and optax chains), `checkpointing` (orbax, checksums and fallback), `logger`
(metrics.jsonl, TensorBoard, progress bar) and `runtime` (host allocator tuning).
The loop that uses them is `tfjax.runs.trainer`.
"""

from tfjax import _lazy

__all__ = ["checkpointing", "logger", "mlm", "optim", "runtime", "steps"]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
