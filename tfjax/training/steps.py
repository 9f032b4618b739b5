"""Train state and the pure train and eval steps.

`make_train_step` returns `train_step(state, batch, rng, axis_name=None) -> (state, metrics)`:
forward with dropout, cross-entropy with label smoothing (Vaswani et al. 2017, §5.4), backward,
optax update. With `axis_name` (pmap) gradients and metric sums are summed over that axis; the
loss is normalised by the global number of target tokens, so every parallel mode computes the
same gradient as one device with the whole batch. Metrics are float32 sums and weights
(`tfjax.nn.losses`), divided on the host at log time. The loop itself is in `tfjax.runs.loop`.
Masked-LM runs pass a `tfjax.training.mlm.Masking`: the steps mask the inputs themselves and
score only the masked positions. `unscored_id` leaves one target id out of the loss and the
scores (`train.predict_eos=False`: EOS, for models that are not trained to end their outputs,
Newman et al. 2020's "-EOS" models).
"""

from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tfjax.models import kinds
from tfjax.nn import losses
from tfjax.training import mlm

Batch = dict[
    str, Any
]  # str -> int32 [B, ...] numpy or jax arrays (docs/design.md, "How data flows")


@flax.struct.dataclass
class TrainState:
    """Arrays only: the step counter, parameters and optimizer state."""

    step: Any  # int32 [] (Any: tree transforms put ShapeDtypeStructs and tracers here)
    params: Any
    opt_state: Any


def model_inputs(batch: Batch, kind: str) -> tuple[tuple, dict]:
    """(positional args, keyword args) of the model's `__call__` taken from a batch: the
    kind's `fields`, then their segment ids and positions (`kinds.ModelKind.input_keys`)."""
    record = kinds.get(kind)
    present = {k: batch[k] for k in record.input_keys if k in batch}
    return tuple(present.pop(k) for k in record.fields), present


def batch_metrics(
    logits: jax.Array, batch: Batch, kind: str, *, label_smoothing: float | jax.Array
) -> Batch:
    """Loss and accuracy sums of one batch (`tfjax.nn.losses.compute_metrics`; masked-LM
    batches, which carry `mlm_targets`, `tfjax.training.mlm.metrics`)."""
    if mlm.TARGETS in batch:
        return mlm.metrics(
            logits, batch[mlm.TARGETS], batch[mlm.WEIGHTS], label_smoothing=label_smoothing
        )
    if kinds.get(kind).scores == "labels":
        return losses.classification_metrics(
            logits, batch["labels"], label_smoothing=label_smoothing
        )
    return losses.compute_metrics(
        logits,
        batch["targets"],
        batch["targets_segment_ids"],
        label_smoothing=label_smoothing,
        loss_weights=batch.get("targets_weights"),
    )


def unscore_target_id(batch: Batch, token_id: int) -> Batch:
    """`batch` with every target position holding `token_id` given `targets_weights` 0: no
    loss, no accuracy, and not part of its sequence's exact match (other weights are kept)."""
    keep = (batch["targets"] != token_id).astype(jnp.int32)
    if "targets_weights" in batch:
        keep = keep * (batch["targets_weights"] > 0)
    return {**batch, "targets_weights": keep}


def _weight_sum(batch: Batch, kind: str) -> jax.Array:
    if mlm.WEIGHTS in batch:
        return jnp.sum(batch[mlm.WEIGHTS])
    if kinds.get(kind).scores == "labels":
        return jnp.sum(batch["labels"] >= 0).astype(jnp.float32)
    weights = batch["targets_segment_ids"] > 0
    if "targets_weights" in batch:
        weights = weights & (batch["targets_weights"] > 0)
    return jnp.sum(weights).astype(jnp.float32)


def create_train_state(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    batch: Batch,
    kind: str,
) -> TrainState:
    """Initial state; `batch` only provides shapes (use `jax.eval_shape` for an abstract one)."""
    args, kwargs = model_inputs(jax.tree.map(jnp.asarray, batch), kind)
    params = model.init(rng, *args, **kwargs)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
    )


def global_norm(tree: Any, *, fast_path: bool = True) -> jax.Array:
    """sqrt(Σ x²) over every element of every leaf, a float32 scalar (`optax.tree.norm`).

    On the CPU the leaves are raveled into one vector and reduced once: XLA then emits one
    reduction, where one per array made a fifth of the benchmark step's fusions (compile time
    and per-thunk overhead; figures in docs/performance.md). On GPUs and TPUs
    it is one reduction per array, as in optax: concatenating parameters sharded over a mesh
    (FSDP) would gather them.
    """
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    if not fast_path:  # the stock reduction on every platform
        return _norm_per_array(leaves)
    return jax.lax.platform_dependent(leaves, cpu=_norm_raveled, default=_norm_per_array)


def _norm_raveled(leaves: list[jax.Array]) -> jax.Array:
    flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in leaves])
    return jnp.sqrt(jnp.sum(jnp.square(flat)))


def _norm_per_array(leaves: list[jax.Array]) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def make_train_step(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    kind: str,
    label_smoothing: float | jax.Array,
    grad_accum_steps: int = 1,
    masking: mlm.Masking | None = None,
    unscored_id: int | None = None,
) -> Callable:
    """The pure train step for `model` (see the module docstring); `label_smoothing` may be a
    traced scalar (a trial of a vectorised sweep). With `masking` (an encoder-only model with
    the "mlm" head) the step masks the inputs itself (`tfjax.training.mlm`) with a key split
    from the step's, and scores only the masked positions. `unscored_id`: a target id that
    gets no loss (`unscore_target_id`; None = every target is scored)."""
    _check_unscored(unscored_id, kind)

    def train_step(state: TrainState, batch: Batch, rng: jax.Array, axis_name: str | None = None):
        rng = jax.random.fold_in(rng, state.step)
        if unscored_id is not None:
            batch = unscore_target_id(batch, unscored_id)
        if masking is not None:
            rng, mask_rng = jax.random.split(rng)
            rows = batch["inputs"].shape[0]
            first = 0 if axis_name is None else jax.lax.axis_index(axis_name) * rows
            batch = mlm.mask_batch(batch, masking, mask_rng, first_row=first)
        weight_sum = _weight_sum(batch, kind)
        if axis_name is not None:
            rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
            weight_sum = jax.lax.psum(weight_sum, axis_name)
        args, kwargs = model_inputs(batch, kind)

        def loss_fn(params):
            logits = model.apply(
                {"params": params}, *args, **kwargs, deterministic=False, rngs={"dropout": rng}
            )
            metrics = batch_metrics(logits, batch, kind, label_smoothing=label_smoothing)
            return metrics["loss_sum"] / jnp.maximum(weight_sum, 1.0), metrics

        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
        if axis_name is not None:
            grads = jax.lax.psum(grads, axis_name)
            metrics = jax.lax.psum(metrics, axis_name)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = global_norm(grads)
        metrics["learning_rate"] = schedule(state.step // grad_accum_steps)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def _check_unscored(unscored_id: int | None, kind: str) -> None:
    if unscored_id is not None and kinds.get(kind).scores == "labels":
        raise ValueError(f"unscored_id is for models with targets, not {kind} models")


def make_eval_step(
    model: nn.Module,
    *,
    kind: str,
    label_smoothing: float,
    masking: mlm.Masking | None = None,
    unscored_id: int | None = None,
) -> Callable:
    """`eval_step(params, batch, axis_name=None) -> metric sums`, deterministic (with
    `masking`, each example's masks are fixed: `tfjax.training.mlm.mask_eval_batch`;
    `unscored_id` as in `make_train_step`)."""
    _check_unscored(unscored_id, kind)

    def eval_step(params: Any, batch: Batch, axis_name: str | None = None):
        if unscored_id is not None:
            batch = unscore_target_id(batch, unscored_id)
        if masking is not None:
            batch = mlm.mask_eval_batch(batch, masking)
        args, kwargs = model_inputs(batch, kind)
        logits = model.apply({"params": params}, *args, **kwargs, deterministic=True)
        metrics = batch_metrics(logits, batch, kind, label_smoothing=label_smoothing)
        return metrics if axis_name is None else jax.lax.psum(metrics, axis_name)

    return eval_step
