"""A run built from its config: `build(config, workdir)` gives the `Run` the training loop uses.

The config is checked before (`tfjax.runs.validation`); config.json and the checkpoints'
format are `tfjax.runs.workdir_format`'s, restoring `tfjax.runs.restoration`'s, the examples
and the data-free sample batch `tfjax.runs.run_data`'s. The pieces that need no data (the
`make_*` functions, `abstract_train_state`) also serve ahead-of-time planning
(`tfjax.runs.plan`), so it plans what training runs.
"""

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import optax
from jaxtyping import Array, Int

from tfjax import models
from tfjax.data import datasets, pipeline, tokenizers
from tfjax.inference import decoding
from tfjax.models import kinds, partitioning
from tfjax.parallel import strategies
from tfjax.runs import run_data
from tfjax.training import mlm, mup, optim, steps

# The model's parameters: a nested dict of arrays (or `jax.ShapeDtypeStruct`s).
Params = Any
# The compiled train step: (state, batch, dropout key) -> (next state, metric sums).
TrainStep = Callable[
    [steps.TrainState, steps.Batch, jax.Array], tuple[steps.TrainState, dict[str, jax.Array]]
]
# The jitted eval step: (params, batch) -> metric sums (`steps.batch_metrics`).
EvalStep = Callable[[Params, steps.Batch], dict[str, jax.Array]]
# Jitted greedy decoding: (params, source ids, their segment ids) -> generated ids.
Greedy = Callable[[Params, Int[Array, "B S"], Int[Array, "B S"]], Int[Array, "B L"]]
Strategy = strategies.Pmap | strategies.Sharded


@dataclasses.dataclass
class Evaluable:
    """What evaluating and decoding a model needs (`tfjax.runs.evaluator`): a vectorised
    sweep's trial is one, sharing its group's model and steps."""

    config: ml_collections.ConfigDict
    model_config: models.ModelConfig
    model: nn.Module
    examples: datasets.Examples
    eval_step: EvalStep
    greedy: Greedy  # seq2seq runs decode with it; compiled when first called


@dataclasses.dataclass
class Run(Evaluable):
    """Everything the loop needs, built once from the config."""

    strategy: Strategy
    train_step: TrainStep  # compiled by `strategy`
    abstract_state: steps.TrainState  # of `jax.ShapeDtypeStruct`s
    optimizer: optax.GradientTransformation


def optim_config(config: ml_collections.ConfigDict) -> optim.OptimConfig:
    """`OptimConfig(**config.optim)`; cosine and wsd `decay_steps` 0 = the whole run, in
    updates."""
    fields = config.optim.to_dict()
    if fields["schedule"] in ("cosine", "wsd") and not fields["decay_steps"]:
        # 0 = decay over the whole run, counted in applied updates.
        fields["decay_steps"] = config.train.num_train_steps // fields["grad_accum_steps"]
    return optim.OptimConfig(**fields)


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Run:
    """The run of `config`; with the tokenizer saved in `workdir` no data is read here (the
    examples' splits are read when first used, `datasets.Examples.deferred`)."""
    examples = run_data.load_examples(config, workdir)
    model_config = make_model_config(config, examples.tokenizer.vocab_size)
    model = models.create_model(model_config)
    optimizer, schedule = make_optimizer(config, model_config)
    strategy = make_strategy(config)
    abstract_state = abstract_train_state(
        model, optimizer, run_data.sample_batch(config), model_config.kind
    )
    masking = make_masking(config, examples.tokenizer)
    eos_id = examples.tokenizer.eos_id
    train_step = make_train_step(config, model, optimizer, schedule, masking, eos_id)
    eval_step = jax.jit(
        steps.make_eval_step(
            model,
            kind=model_config.kind,
            label_smoothing=config.train.label_smoothing,
            masking=masking,
            unscored_id=unscored_id(config, eos_id),
        )
    )
    return Run(
        config=config,
        model_config=model_config,
        model=model,
        examples=examples,
        strategy=strategy,
        train_step=strategy.compile_train_step(train_step, abstract_state),
        eval_step=eval_step,
        abstract_state=abstract_state,
        optimizer=optimizer,
        greedy=make_greedy(model, config.data.max_target_len, eos_id),
    )


def train_iterator(run: Run) -> pipeline.BatchIterator:
    """This process's rows of every global training batch (all of them in one process)."""
    global_batch_size = run.config.train.global_batch_size
    dataset = pipeline.make_host_dataset(
        run.examples.train,
        global_batch_size=global_batch_size,
        rows=run.strategy.host_rows(global_batch_size),
        seed=run.config.seed,
    )
    return pipeline.BatchIterator(dataset)


def make_model_config(
    config: ml_collections.ConfigDict, tokenizer_vocab_size: int
) -> models.ModelConfig:
    """`ModelConfig(**config.model)`; `model.vocab_size` 0 takes the tokenizer's size."""
    fields = config.model.to_dict()
    fields["vocab_size"] = fields["vocab_size"] or tokenizer_vocab_size
    return models.ModelConfig(**fields)


def make_optimizer(
    config: ml_collections.ConfigDict, model_config: models.ModelConfig
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, schedule) of `config.optim` (`tfjax.training.optim.make_optimizer`)."""
    multipliers = mup.lr_multipliers(model_config, config.optim.optimizer)  # μP's; None: none
    return optim.make_optimizer(optim_config(config), model_config.embed_dim, multipliers)


def make_strategy(
    config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None
) -> Strategy:
    """The strategy of `config.parallel` over `devices` (default: the job's devices); mode
    "sharded" lays parameters out by their logical axes (`tfjax.models.partitioning`)."""
    parallel = config.parallel
    return strategies.create(
        parallel.mode,
        fsdp=parallel.fsdp,
        tensor=parallel.tensor,
        rules=parallel.rules,
        logical_axes=partitioning.state_axes,
        devices=devices,
    )


def make_masking(
    config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer | None = None
) -> mlm.Masking | None:
    """The masking of a masked-LM run (`model.encoder_head="mlm"`), else None; without a
    `tokenizer` (planning ahead of the data) a stand-in that masks the same shapes.

    Raises:
        tfjax.errors.ConfigError: for a tokenizer without a mask token.
    """
    if kinds.get(config.model.kind).example_format(config.model.encoder_head) != datasets.MLM:
        return None
    if tokenizer is None:
        return mlm.Masking(mask_id=1, vocab_size=2, special_ids=(0,), rate=config.train.mlm_rate)
    return mlm.masking_for(tokenizer, config.train.mlm_rate)


def unscored_id(config: ml_collections.ConfigDict, eos_id: int = tokenizers.EOS_ID) -> int | None:
    """The target id the steps leave out of the loss: `eos_id` when `train.predict_eos` is
    False (a "-EOS" model), else None."""
    return None if config.train.predict_eos else eos_id


def make_train_step(
    config: ml_collections.ConfigDict,
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    masking: mlm.Masking | None = None,
    eos_id: int = tokenizers.EOS_ID,
) -> Callable:
    """The pure train step of `config` (`tfjax.training.steps.make_train_step`), not compiled;
    `masking` for a masked-LM run (default: `make_masking`'s stand-in); `eos_id`, the
    tokenizer's, is left out of the loss when `train.predict_eos` is False (`unscored_id`)."""
    return steps.make_train_step(
        model,
        optimizer,
        schedule,
        kind=config.model.kind,
        label_smoothing=config.train.label_smoothing,
        grad_accum_steps=config.optim.grad_accum_steps,
        masking=masking or make_masking(config),
        unscored_id=unscored_id(config, eos_id),
    )


def abstract_train_state(
    model: nn.Module, optimizer: optax.GradientTransformation, sample: steps.Batch, kind: str
) -> steps.TrainState:
    """The train state as `jax.ShapeDtypeStruct`s (`jax.eval_shape`: nothing is allocated);
    `sample` is a batch (arrays or `ShapeDtypeStruct`s) that only provides shapes."""
    return jax.eval_shape(
        lambda: steps.create_train_state(model, optimizer, jax.random.key(0), sample, kind)
    )


def make_greedy(model: nn.Module, max_length: int, eos_id: int = tokenizers.EOS_ID) -> Greedy:
    """Cached greedy decoding (`decoding.generate`) that stops at `eos_id`, jitted once."""

    def greedy(params, inputs, segment_ids):
        return decoding.generate(
            model,
            params,
            inputs=inputs,
            inputs_segment_ids=segment_ids,
            max_length=max_length,
            eos_id=eos_id,
        )

    return jax.jit(greedy)
