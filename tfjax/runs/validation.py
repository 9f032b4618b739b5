"""Refuses a config a run cannot use, before any data is read or anything written.

`check_config(config)` builds the `data`, `model` and `optim` dataclasses (whose checks name
the field and the allowed values) and checks the `train` and `parallel` groups: the counts, the
rates, the mesh sizes and layout rules, and, where parameters are sharded, that every parameter
of the model has a layout that divides (from abstract shapes: nothing is allocated). Every road
that starts a run calls it once (`experiments.train`, `tfjax.runs.trainer`, a vectorised sweep's
trials, `tfjax.runs.pretrained.convert`).
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from tfjax import errors, models
from tfjax.data import datasets
from tfjax.models import kinds, partitioning
from tfjax.parallel import layout, strategies
from tfjax.runs import build
from tfjax.training import profiling, steps

# Fields of the `train` group that must be >= 1 (0 would divide by zero in the loop) or >= 0.
_TRAIN_POSITIVE = (
    "global_batch_size",
    "eval_batch_size",
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
)
_TRAIN_NON_NEGATIVE = (
    "num_train_steps",
    "eval_every_steps",
    "max_eval_examples",
    "final_eval_examples",
)


def check_config(config: ml_collections.ConfigDict) -> None:
    """Refuses a config the run cannot use, before any data is read or anything written.

    Builds the `data`, `model` and `optim` dataclasses (whose checks name the field and the
    allowed values) and checks the `train` and `parallel` groups. Touches no device, so it may
    run before `tfjax.training.host.tune_glibc_malloc`.

    Raises:
        tfjax.errors.ConfigError: naming the key, its value and what it may be.
    """
    datasets.DataConfig(**config.data)
    vocab_size = config.model.vocab_size or 2  # 0: the tokenizer's size, known after the data
    models.ModelConfig(**{**config.model.to_dict(), "vocab_size": vocab_size})
    build.optim_config(config)
    _check_positions(config)
    _check_train(config.train, config.model.kind)
    _check_parallel(config.parallel)
    _check_layout(config)


def _check_train(train: ml_collections.ConfigDict, kind: str) -> None:
    """The `train` group: counts, rates, profiled steps, `predict_eos` for the model kind."""
    for field in _TRAIN_POSITIVE + _TRAIN_NON_NEGATIVE:
        value, least = train[field], int(field in _TRAIN_POSITIVE)
        if not isinstance(value, int) or value < least:
            raise errors.ConfigError(f"train.{field} must be an integer >= {least}, got {value!r}")
    if not 0 <= train.label_smoothing < 1:
        raise errors.ConfigError(
            f"train.label_smoothing must be in [0, 1), got {train.label_smoothing}"
        )
    profiling.check_steps(train.profile_steps)
    if not 0 < train.mlm_rate < 1:
        raise errors.ConfigError(f"train.mlm_rate must be in (0, 1), got {train.mlm_rate}")
    if not train.predict_eos and kinds.get(kind).scores != "targets":
        raise errors.ConfigError(
            "train.predict_eos=False is for models that generate "
            f"({', '.join(kinds.names(scores='targets'))}); drop it for this {kind} run"
        )


def _check_parallel(parallel: ml_collections.ConfigDict) -> None:
    """The `parallel` group's mode and timeouts (its mesh and rules: `_check_layout`)."""
    if parallel.mode not in strategies.MODES:
        raise errors.ConfigError(
            f"parallel.mode={parallel.mode!r} is not one of {strategies.MODES}"
        )
    for field in ("initialization_timeout_seconds", "heartbeat_timeout_seconds"):
        value = parallel[field]
        if not isinstance(value, int) or value < 1:
            raise errors.ConfigError(f"parallel.{field} must be an integer >= 1, got {value!r}")


def _check_positions(config: ml_collections.ConfigDict) -> None:
    """A learned position table (`model.positional="learned"`) must have a row for every
    position of the data: the model would otherwise clip the positions past it to its last
    row inside compiled code, where nothing can be checked.

    Raises:
        tfjax.errors.ConfigError: naming the data length, the table's size and the fix.
    """
    model = config.model
    if model.positional != "learned":
        return
    for key in kinds.get(model.kind).lengths:  # the longest row (or packed segment) of a stack
        length = config.data[key]
        if length > model.max_len:
            raise errors.ConfigError(
                f"data.{key}={length} is longer than the model's learned position table "
                f"(model.max_len={model.max_len} positions): set data.{key} <= {model.max_len}"
            )


def _check_layout(config: ml_collections.ConfigDict) -> None:
    """The mesh sizes and `parallel.rules`, and, in mode "sharded" with fsdp or tensor > 1, that
    every parameter of the model gets a layout that divides (shapes from `jax.eval_shape`:
    nothing is allocated)."""
    parallel = config.parallel
    for axis in strategies.MESH_AXES[1:]:
        if not isinstance(parallel[axis], int) or parallel[axis] < 1:
            raise errors.ConfigError(
                f"parallel.{axis} must be an integer >= 1, got {parallel[axis]!r}"
            )
    rules = layout.check_rules(parallel.rules, partitioning.LOGICAL_AXES)
    if parallel.mode != "sharded":
        for axis in strategies.MESH_AXES[1:]:
            if parallel[axis] != 1:
                raise errors.ConfigError(
                    f"parallel.{axis}={parallel[axis]} needs --config.parallel.mode=sharded"
                )
        return
    sizes = {axis: parallel[axis] for axis in strategies.MESH_AXES[1:]}
    if all(size == 1 for size in sizes.values()):
        return  # plain data parallelism: every parameter is replicated, nothing to divide
    # 0: the tokenizer's size, known after the data; a stand-in every mesh axis divides.
    vocab_size = config.model.vocab_size or 2 * math.prod(sizes.values())
    params = abstract_params(build.make_model_config(config, vocab_size))
    axes = partitioning.logical_axes(params)
    jax.tree_util.tree_map_with_path(
        lambda path, x, names: layout.param_spec(
            jax.tree_util.keystr(path, simple=True, separator="/"),
            tuple(x.shape),
            names,
            rules,
            sizes,
            strategies.FSDP_MIN_SIZE,
        ),
        params,
        axes,
    )


def abstract_params(model_config: models.ModelConfig) -> Any:
    """The model's parameters as `jax.ShapeDtypeStruct`s, from a one-token-row sample."""
    model = models.create_model(model_config)
    row = jax.ShapeDtypeStruct((1, 1), jnp.int32)  # a shape, not an array: no device touched
    args, kwargs = steps.model_inputs({"inputs": row, "targets": row}, model_config.kind)
    init = lambda *a, **k: model.init(jax.random.key(0), *a, **k)  # noqa: E731
    return jax.eval_shape(init, *args, **kwargs)["params"]
