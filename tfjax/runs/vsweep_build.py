"""A vectorised sweep's group built: what `tfjax.runs.build` is to a run alone.

`Group(trials, directory, judge)` loads the examples of each seed, builds the model the trials
share, stacks their hyperparameters on a leading trial axis (traced where they differ), compiles
the step vectorised over that axis (`tfjax.training.vectorized`) on the (trial, data) mesh, gives
each trial what its evaluations need (`build.Evaluable`), and restores or creates the group's
state (`Group.initial`). Training it is `tfjax.runs.vsweep`'s.
"""

import logging
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from tfjax import models
from tfjax.runs import build, pbt, vsweep_state, workdir_format
from tfjax.training import optim, steps, vectorized

log = logging.getLogger(__name__)


class Group:
    """The trials' shared model, data and compiled step, their hyperparameters stacked on the
    trial axis and each trial's `build.Evaluable`; `vsweep.train_trials` runs them through the
    loop. `trials` are `vsweep.Trial`s of one group, `judge` a `vsweep.Judge` or None."""

    def __init__(self, trials: Sequence[Any], directory: pathlib.Path, judge: Callable | None):
        self.trials, self.directory, self.judge = list(trials), directory, judge
        self.config = trials[0].config
        vsweep_state.check_trial_names(directory, self.trials)
        self.examples = vsweep_state.load_examples(
            self.trials, bool(workdir_format.saved_steps(directory))
        )
        vocab = self.examples[self.config.seed].tokenizer.vocab_size
        self.model_config = build.make_model_config(self.config, vocab)
        self.model = models.create_model(self.model_config)
        optim_configs = [build.optim_config(trial.config) for trial in trials]  # checked
        self.structure = optim.traced_structure(optim_configs)
        hyper = [optim.traced_hyper(c, self.structure) for c in optim_configs]
        smoothing = [trial.config.train.label_smoothing for trial in trials]
        self.label_smoothing = smoothing[0] if len(set(smoothing)) == 1 else None  # None: traced
        rates = [
            (trial.config.model.dropout_rate, trial.config.model.attention_dropout_rate)
            for trial in trials
        ]
        self.traced_dropout = None if len(set(rates)) == 1 else self.model_config
        self.pbt = pbt.settings([trial.config for trial in trials])
        explored = set(self.pbt.names) if self.pbt else set()
        if "label_smoothing" in explored:  # PBT changes it per trial: traced
            self.label_smoothing = None
        if explored & {"dropout_rate", "attention_dropout_rate"}:
            self.traced_dropout = self.model_config
        for values, value, (rate, attention_rate) in zip(hyper, smoothing, rates, strict=True):
            values["label_smoothing"] = jnp.float32(value)
            values["dropout_rate"] = jnp.float32(rate)
            values["attention_dropout_rate"] = jnp.float32(attention_rate)
        self.hyper = vectorized.stack(hyper)  # {name: [T]}
        self.seeds = [trial.config.seed for trial in trials]
        self.shared_batch = len(set(self.seeds)) == 1
        self._eval_steps: dict[float, object] = {}
        self._greedy = build.make_greedy(self.model, self.config.data.max_target_len)  # shared
        eos_id = self.examples[self.config.seed].tokenizer.eos_id
        self.unscored_id = build.unscored_id(self.config, eos_id)  # a group shares predict_eos
        self.runs = [self._trial_run(trial) for trial in trials]
        self.placement = vsweep_state.Placement.create(
            len(trials), self.config.train.global_batch_size, shared_batch=self.shared_batch
        )
        self.step_fn = self._compile()

    def _trial_run(self, trial: Any) -> build.Evaluable:
        """What `evaluator.evaluate` needs of one trial (its data and label smoothing); the
        trials share the compiled greedy decoder and one eval step per smoothing value."""
        smoothing = trial.config.train.label_smoothing
        if smoothing not in self._eval_steps:
            self._eval_steps[smoothing] = jax.jit(
                steps.make_eval_step(
                    self.model,
                    kind=self.model_config.kind,
                    label_smoothing=smoothing,
                    unscored_id=self.unscored_id,
                )
            )
        return build.Evaluable(
            config=trial.config,
            model_config=self.model_config,
            model=self.model,
            examples=self.examples[trial.config.seed],
            eval_step=self._eval_steps[smoothing],
            greedy=self._greedy,
        )

    def _compile(self):
        step = vectorized.make_vectorized_train_step(
            self.model,
            self.structure,
            d_model=self.model_config.embed_dim,
            kind=self.model_config.kind,
            label_smoothing=self.label_smoothing,
            shared_batch=self.shared_batch,
            traced_dropout=self.traced_dropout,
            unscored_id=self.unscored_id,
        )
        return self.placement.jit(step)

    def initial(self, checkpointer):
        """(SweepState, dropout keys [T], start step, data_state) restored, or fresh (data_state
        None). Each trial's keys are those of a run alone with its seed."""
        keys = [jax.random.split(jax.random.key(seed)) for seed in self.seeds]
        init_rngs = jnp.stack([k[0] for k in keys])  # [T] keys
        dropout_rngs = jnp.stack([k[1] for k in keys])
        abstract, init = vsweep_state.abstract_state(self.runs[0], self.structure, len(self.trials))
        restored = vsweep_state.restore(checkpointer, self.placement.place_abstract(abstract), self)
        if restored is not None:
            log.info("resumed the sweep from %s at step %d", checkpointer.directory, restored.step)
            return restored.state, restored.rng, restored.step, restored.data_state
        state = vectorized.SweepState(
            train=jax.jit(init)(init_rngs), live=jnp.ones(len(self.trials), bool)
        )
        return self.placement.put_state(state), dropout_rngs, 0, None
