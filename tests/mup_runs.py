"""Tiny models trained a few steps with `make_optimizer` and μP's multipliers, shared by the
μP tests (test_mup.py, test_coord_check.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tfjax import models
from tfjax.training import mup, optim, steps

TINY = dict(
    vocab_size=13,
    embed_dim=16,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    mlp_dim=32,
    max_len=16,
    dropout_rate=0.0,
)


def config(**overrides) -> models.ModelConfig:
    return models.ModelConfig(**(TINY | overrides))


def batch(kind: str, seed: int = 0, rows: int = 4, length: int = 8, vocab: int = 13) -> dict:
    """A batch of random tokens for `kind` (class labels for the encoder-only model)."""
    rng = np.random.default_rng(seed)
    tokens = lambda: jnp.asarray(rng.integers(2, vocab, (rows, length)), jnp.int32)  # noqa: E731
    ones = jnp.ones((rows, length), jnp.int32)
    if kind == "encoder_only":
        labels = jnp.asarray(rng.integers(0, 2, (rows,)), jnp.int32)
        return {"inputs": tokens(), "inputs_segment_ids": ones, "labels": labels}
    out = {"targets": tokens(), "targets_segment_ids": ones}
    if kind == "encoder_decoder":
        out |= {"inputs": tokens(), "inputs_segment_ids": ones}
    return out


def train(cfg: models.ModelConfig, num_steps: int, lr: float = 1e-2, optimizer: str = "adam"):
    """(losses, initial state, final state) of `num_steps` constant-LR steps on one batch."""
    kind = cfg.kind
    model = models.create_model(cfg)
    opt_config = optim.OptimConfig(
        optimizer=optimizer, schedule="constant", learning_rate=lr, warmup_steps=0
    )
    multipliers = mup.lr_multipliers(cfg, optimizer)
    optimizer_, schedule = optim.make_optimizer(opt_config, cfg.embed_dim, multipliers)
    data = batch(kind, vocab=cfg.vocab_size)
    state = steps.create_train_state(model, optimizer_, jax.random.key(0), data, kind)
    step = jax.jit(
        steps.make_train_step(model, optimizer_, schedule, kind=kind, label_smoothing=0.0)
    )
    first, losses = state, []
    for _ in range(num_steps):
        state, metrics = step(state, data, jax.random.key(1))
        losses.append(float(metrics["loss_sum"]) / float(metrics["weight_sum"]))
    return losses, first, state


def replace(cfg: models.ModelConfig, **fields) -> models.ModelConfig:
    return dataclasses.replace(cfg, **fields)
