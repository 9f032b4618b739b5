"""What the benchmarks run: the model shapes, a random batch, the tfjax model and its train step.

`SHAPE` ("base", the default) is the benchmark shape of the project's issues: encoder-decoder,
vocabulary 8000, d_model 256, 3+3 layers, 4 heads, d_ff 1024, dropout 0.1, batch 32, source and
target length 64, tied embeddings. `LARGE_SHAPE` ("large") is the accelerator shape: the paper's
"big" widths (d_model 1024, d_ff 4096, 16 heads) on 6+6 layers, vocabulary 32000, batch 64,
length 256; run it in bfloat16 (parameters and optimizer state stay float32).
"""

from collections.abc import Callable

import jax
import numpy as np
import optax
from flax import linen as nn

from tfjax import models
from tfjax.training import optim, steps

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
_DATA_FIELDS = ("batch", "source_len", "target_len")


def model_fields(shape: dict) -> dict:
    """The `ModelConfig` fields of a shape (all but batch and lengths)."""
    return {k: v for k, v in shape.items() if k not in _DATA_FIELDS}


def create_model(
    dtype: str, shape: dict = SHAPE, attention_impl: str = "auto", residual_impl: str = "xla"
) -> nn.Module:
    """The tfjax encoder-decoder of `shape` computing in `dtype`; max_len = max(512, S, L)."""
    return models.create_model(
        models.ModelConfig(
            **model_fields(shape),
            max_len=max(512, shape["source_len"], shape["target_len"]),
            dtype=dtype,
            attention_impl=attention_impl,
            residual_impl=residual_impl,
        )
    )


def random_batch(batch: int, shape: dict = SHAPE) -> dict:
    """Random ids in [3, V) (no padding): "inputs" [B, S], "targets" [B, L], segment ids 1.

    All four arrays are int32 numpy, drawn from a fixed seed (the torch peer reads the same).
    """
    rng = np.random.default_rng(0)
    shape_s, shape_l = (batch, shape["source_len"]), (batch, shape["target_len"])
    return {
        "inputs": rng.integers(3, shape["vocab_size"], shape_s, dtype=np.int32),
        "targets": rng.integers(3, shape["vocab_size"], shape_l, dtype=np.int32),
        "inputs_segment_ids": np.ones(shape_s, np.int32),
        "targets_segment_ids": np.ones(shape_l, np.int32),
    }


def with_positions(data: dict) -> dict:
    """`data` with "inputs_positions" and "targets_positions" 0..n-1 (what packed rows carry;
    the same positions the model defaults to, so the same step, but its masks stay dense)."""
    out = dict(data)
    for field in ("inputs", "targets"):
        batch, length = data[field].shape
        out[f"{field}_positions"] = np.broadcast_to(
            np.arange(length, dtype=np.int32), (batch, length)
        ).copy()
    return out


def make_train_step(
    data: dict,
    dtype: str,
    shape: dict = SHAPE,
    attention_impl: str = "auto",
    prng_impl: str | None = None,
    *,
    flatten_optimizer: bool = False,
    residual_impl: str = "xla",
) -> tuple[Callable[[], dict], int]:
    """One jitted tfjax train step on `data`, as a closure that carries its state.

    Args:
      data: a `random_batch` dict.
      dtype: compute dtype.
      shape: a `SHAPES` entry.
      attention_impl: `ModelConfig.attention_impl`.
      prng_impl: PRNG implementation of the dropout key (None: JAX's default).
      flatten_optimizer: wrap the optimizer in `optax.flatten`: its state and update are one
        vector over all parameters, so the update is a few large kernels, not one per array.
      residual_impl: `ModelConfig.residual_impl` ("pallas": the fused post-LN kernels).

    Returns:
      (`run() -> metrics`, which donates and replaces the train state, parameter count);
      `run.lower()` lowers the step for the current state without running it.
    """
    model = create_model(dtype, shape, attention_impl, residual_impl)
    optimizer, schedule = optim.make_optimizer(optim.OptimConfig(), shape["embed_dim"])
    if flatten_optimizer:
        optimizer = optax.flatten(optimizer)
    # Jitted, as the trainer and the Flax peer build theirs: eager `init` runs the forward op
    # by op and leaves the process larger (measurements: docs/performance.md).
    state = jax.jit(
        lambda key: steps.create_train_state(model, optimizer, key, data, "encoder_decoder")
    )(jax.random.key(0))
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

    run.lower = lambda: step.lower(holder["state"], data, dropout_key)  # AOT, for rss.py
    return run, num_params
