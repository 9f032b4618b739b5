"""One train step for many trials: `jax.vmap` of the ordinary step over a leading trial axis.

Trials that share a model shape train together as one program (`tfjax.runs.vsweep`): every
leaf of the train state, the dropout keys and the hyperparameters (`optim.traced_hyper`) get a
leading trial axis [T, ...] (label smoothing and the dropout rate too, when the trials
differ in them); the batch has one too when the trials read different data (their
seeds differ), else all trials read the same batch. Each trial computes exactly what
`steps.make_train_step` computes for it alone, with its optimizer built from its own
hyperparameters (`optim.traced_optimizer`).

A trial whose loss or gradient norm is not finite is frozen: from that step on its state is
kept as it was (its updates are masked out) and `live` turns False; the other trials go on.
Successive halving freezes trials the same way (`freeze`).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from tfjax import models
from tfjax.training import mup, optim, steps


@flax.struct.dataclass
class SweepState:
    """The trials' train states stacked on a leading axis, and which trials still train.

    Attributes:
        train: a `steps.TrainState` whose every leaf is [T, ...].
        live: bool [T]; False once a trial is frozen (non-finite loss, or stopped early).
    """

    train: Any
    live: Any


def stack(trees: list) -> Any:
    """The trees' leaves stacked on a new leading axis (the trial axis)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def unstack(tree: Any, index: int) -> Any:
    """Trial `index` of a stacked tree."""
    return jax.tree.map(lambda leaf: leaf[index], tree)


def freeze(state: SweepState, trials: Any) -> SweepState:
    """`state` with the trials where `trials` (bool [T]) is True frozen."""
    return state.replace(live=state.live & ~trials)


def make_vectorized_train_step(
    model: nn.Module,
    structure: optim.TracedStructure,
    *,
    d_model: int,
    kind: str,
    label_smoothing: float | None,
    shared_batch: bool,
    traced_dropout: models.ModelConfig | None = None,
    unscored_id: int | None = None,
) -> Callable:
    """`step(state: SweepState, batch, rngs [T], hyper {name: [T]}) -> (SweepState, metrics)`.

    Args:
        model: the model every trial trains (one shape; the trials differ in their arrays).
        structure: what the trials' optimizers share (`optim.traced_structure`).
        d_model: model width, for the "paper" schedule.
        kind: the model kind (`steps.model_inputs`).
        label_smoothing: shared by the trials, or None: each trial's `hyper["label_smoothing"]`
            (a traced scalar; `tfjax.nn.losses.cross_entropy`).
        shared_batch: True when every trial reads the same batch ([B, ...]); False for a
            batch with a leading trial axis ([T, B, ...]).
        traced_dropout: when the trials' dropout rates differ, the model config that each trial
            rebuilds `model` from with its own `hyper["dropout_rate"]` and
            `hyper["attention_dropout_rate"]` (traced rates: `tfjax.nn.layers.Dropout`,
            `attention.core.dropout_active`); None: every trial uses `model`.
        unscored_id: a target id without loss, shared by the trials (`steps.make_train_step`).

    Returns:
        The pure step; metrics are those of `steps.make_train_step`, each [T], plus `live`.
    """

    multipliers = mup.lr_multipliers(model.config, structure.optimizer or "adam")  # μP's

    def one_trial(state, batch, rng, hyper, live):
        optimizer, schedule = optim.traced_optimizer(hyper, structure, d_model, multipliers)
        trial_model = model
        if traced_dropout is not None:
            rates = {k: hyper[k] for k in ("dropout_rate", "attention_dropout_rate")}
            trial_model = models.create_model(dataclasses.replace(traced_dropout, **rates))
        train_step = steps.make_train_step(
            trial_model,
            optimizer,
            schedule,
            kind=kind,
            label_smoothing=hyper["label_smoothing"]
            if label_smoothing is None
            else label_smoothing,
            grad_accum_steps=structure.grad_accum_steps,
            unscored_id=unscored_id,
        )
        new_state, metrics = train_step(state, batch, rng)
        finite = jnp.isfinite(metrics["loss_sum"]) & jnp.isfinite(metrics["grad_norm"])
        keep = live & finite
        new_state = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_state, state)
        return new_state, metrics, keep

    vectorized = jax.vmap(one_trial, in_axes=(0, None if shared_batch else 0, 0, 0, 0))

    def step(state: SweepState, batch: steps.Batch, rngs: jax.Array, hyper: dict):
        train, metrics, live = vectorized(state.train, batch, rngs, hyper, state.live)
        metrics["live"] = live
        return SweepState(train=train, live=live), metrics

    return step
