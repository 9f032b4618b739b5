"""A vectorised sweep: the trials that share a model shape trained as one program.

`train_trials(trials, directory)` trains trials (a name, a resolved config and a workdir
each) whose configs differ only in `VECTOR_KEYS` with one jitted step vectorised over a
leading trial axis (`tfjax.training.vectorized`). Each trial's workdir ends up as an ordinary
run's, except for the checkpoints: `config.json`, the tokenizer, `metrics.jsonl` and
TensorBoard (with the trial's hyperparameters on TensorBoard's hparams dashboard) are written
there; the whole group's state is checkpointed once, in `directory/checkpoints`, and a rerun
resumes every trial exactly (dropping from each `metrics.jsonl` the records of the steps it logs
again, as `trainer` does). A SIGTERM saves the group and stops it, as it stops a run alone
(outcomes "preempted ..."). `extract(directory, trials, name)` writes one trial's checkpoint
into its workdir, which `experiments.train` then resumes and `evaluate`, `translate` and
`generate` read like any other.

The trial axis is sharded over the mesh axis "trial" of the available devices, and the batch
over "data" with the devices left over (4 trials on 8 devices: 2 data-parallel devices each).
A trial whose loss goes non-finite is frozen and reported; `sweep.halving_steps` stops the
worse half of the live trials (by eval loss) at each of those steps (successive halving),
a `judge` (`train_trials`) those its pruner picks at each evaluation (`tfjax.runs.search`);
`sweep.pbt` trains the trials by population-based training instead (`tfjax.runs.pbt`).

The group is built by `tfjax.runs.vsweep_build` (what `tfjax.runs.build` is to a run alone)
and trains through the loop of a run alone (`tfjax.runs.loop`: the same order of
stepping, logging, evaluating and saving, the same SIGTERM handling); what a group does
differently is in its hooks, `_GroupHooks`: the batches of each seed, the vectorised step,
the records of each live trial, freezing, halving (its `adjust`) and the group checkpoint. A
sweep does not trace `train.profile_steps`.
"""

import contextlib
import dataclasses
import json
import logging
import math
import pathlib
import time
from collections.abc import Callable, Sequence

import jax
import ml_collections
import numpy as np

from tfjax import errors
from tfjax.data import pipeline
from tfjax.runs import (
    build,
    evaluator,
    lock,
    loop,
    pbt,
    trainer,
    validation,
    vsweep_build,
    vsweep_state,
    workdir_format,
)
from tfjax.training import checkpointing, logger, optim, vectorized

log = logging.getLogger(__name__)

# Config keys that trials of one group may differ in; the others split a sweep into groups.
VECTOR_KEYS = (
    "seed",
    "model.dropout_rate",
    "model.attention_dropout_rate",
    "train.label_smoothing",
    *(f"optim.{name}" for name in optim.TRACEABLE),
)
_NOT_COMPARED = ("sweep",)  # config groups that do not change what a trial computes


@dataclasses.dataclass
class Trial:
    """One trial: its name in the sweep, resolved config and workdir."""

    name: str
    config: ml_collections.ConfigDict
    workdir: pathlib.Path


PREEMPTED = "preempted"  # a SIGTERM saved and stopped the group: rerun to resume


@dataclasses.dataclass
class Outcome:
    """How a trial ended: "ok", "frozen at step N (...)", "stopped at step N (...)", or
    "preempted at step N" / "preempted before its first step" (a SIGTERM; rerun to resume)."""

    status: str
    final: dict[str, float]


def _flat(config: ml_collections.ConfigDict) -> dict[str, object]:
    tree = workdir_format.config_dict(config)
    out = {}
    for group, value in tree.items():
        if group in _NOT_COMPARED:
            continue
        if isinstance(value, dict):
            out.update({f"{group}.{key}": item for key, item in value.items()})
        else:
            out[group] = value
    return out


def hparams(config: ml_collections.ConfigDict) -> dict[str, object]:
    """A trial's values of `VECTOR_KEYS` (for TensorBoard's hparams dashboard)."""
    flat = _flat(config)
    return {key: flat[key] for key in VECTOR_KEYS}


def group_trials(trials: Sequence[Trial]) -> list[list[Trial]]:
    """The trials split into groups whose configs differ only in `VECTOR_KEYS`, in order."""
    groups: dict[str, list[Trial]] = {}
    for trial in trials:
        shared = {k: v for k, v in _flat(trial.config).items() if k not in VECTOR_KEYS}
        groups.setdefault(json.dumps(shared, sort_keys=True), []).append(trial)
    return list(groups.values())


def splitting_keys(trials: Sequence[Trial]) -> list[str]:
    """The config keys outside `VECTOR_KEYS` whose values differ between `trials`."""
    flats = [_flat(trial.config) for trial in trials]
    return sorted(
        k
        for k in flats[0]
        if k not in VECTOR_KEYS and len({json.dumps(f.get(k)) for f in flats}) > 1
    )


def _check_trials(trials: Sequence[Trial]) -> None:
    names = [trial.name for trial in trials]
    if len(set(names)) < len(names):
        raise errors.ConfigError(f"trial names must be unique, got {names}")
    for trial in trials:
        validation.check_config(trial.config)
    differing = splitting_keys(trials)
    if differing:
        raise errors.ConfigError(
            f"these trials differ in {', '.join(differing)}, which cannot be vectorised "
            f"(only {', '.join(VECTOR_KEYS)} can); split them with group_trials"
        )
    halving = [list(trial.config.sweep.halving_steps) for trial in trials]
    if any(h != halving[0] for h in halving) or not all(
        isinstance(step, int) and step > 0 for step in halving[0]
    ):
        raise errors.ConfigError(
            f"sweep.halving_steps must be the same positive step numbers for every trial, got "
            f"{halving[0]!r}; e.g. --config.sweep.halving_steps=500,1000"
        )
    pbt.settings([trial.config for trial in trials])  # checked: PBT's values, not with halving
    if build.make_masking(trials[0].config) is not None:
        raise errors.ConfigError(
            "a vectorised sweep does not run the masked-LM objective (model.encoder_head='mlm') "
            "yet: sweep without --vectorize"
        )
    parallel = trials[0].config.parallel
    if parallel.fsdp != 1 or parallel.tensor != 1 or jax.process_count() > 1:
        raise errors.ConfigError(
            "a vectorised sweep shards trials over its own (trial, data) mesh of this process's "
            "devices: set parallel.fsdp=1 and parallel.tensor=1, run one process, or sweep "
            "without --vectorize"
        )


Judge = Callable[[int, dict[int, dict[str, float]]], dict[int, str]]


def train_trials(
    trials: Sequence[Trial], directory: str | pathlib.Path, *, judge: Judge | None = None
) -> list[Outcome]:
    """Trains `trials` (one group, see `group_trials`) together; resumes from `directory`.

    Args:
        trials: the group.
        directory: where the group's checkpoints go.
        judge: called after each periodic evaluation with the step and {trial index: its eval
            record} of the live trials; returns {trial index: reason} of those to stop now
            (a search's pruner, `tfjax.runs.search`). They stop as halving stops trials:
            masked from the next step on, "stopped at step N (reason)".

    Returns:
        One `Outcome` per trial, in order.

    Raises:
        tfjax.errors.UserError: for configs that cannot be vectorised together, a directory
            holding another sweep's checkpoints, or a workdir in use.
    """
    _check_trials(trials)
    directory = trainer.make_workdir(pathlib.Path(directory))
    for trial in trials:
        trainer.make_workdir(trial.workdir)
    try:
        with contextlib.ExitStack() as stack:
            preemption = stack.enter_context(loop.Preemption(early=True))
            for path in (directory, *(trial.workdir for trial in trials)):
                stack.enter_context(lock.held(path))
            return _train_group(vsweep_build.Group(trials, directory, judge), preemption)
    except loop.Terminated:
        log.warning(
            "stopped by SIGTERM before the first step: nothing new was saved; rerun the same "
            "command to resume"
        )
        return [Outcome(f"{PREEMPTED} before its first step", {}) for _ in trials]


def _train_group(group: vsweep_build.Group, preemption: loop.Preemption) -> list[Outcome]:
    """Restores or starts `group`, trains it to the end or a SIGTERM (`preemption`
    saves and stops the loop, as for a run alone), evaluates each trial."""
    with checkpointing.Checkpointer(
        group.directory / "checkpoints", max_to_keep=group.config.train.keep_checkpoints
    ) as checkpointer:
        hooks = _GroupHooks(group, checkpointer)
        state, start = hooks.restore()
        state, step = loop.Loop(hooks, group.config.train, checkpointer).run(
            state, start, preemption
        )
        if preemption.requested:
            for writer in hooks.writers:
                writer.close()
            return [
                Outcome(f"{PREEMPTED} at step {step}" if s == "ok" else s, {}) for s in hooks.status
            ]
    return hooks.finish(state, step)


class _GroupHooks:
    """The trials' side of the training loop (`tfjax.runs.loop`): the batches of each seed,
    the group's step, each trial's records in its own workdir (none after it stops), each
    trial's evaluation, trials frozen when their loss goes non-finite, successive halving
    (`adjust`) and the group checkpoint."""

    def __init__(self, group: vsweep_build.Group, checkpointer: checkpointing.Checkpointer):
        self.group, self.checkpointer = group, checkpointer
        tcfg = group.config.train
        self.tcfg = tcfg
        self.iterators = {
            seed: pipeline.BatchIterator(
                pipeline.make_host_dataset(
                    group.examples[seed].train,
                    global_batch_size=tcfg.global_batch_size,
                    rows=slice(0, tcfg.global_batch_size),
                    seed=seed,
                )
            )
            for seed in dict.fromkeys(group.seeds)
        }
        self.writers = [logger.MetricWriter(trial.workdir) for trial in group.trials]
        self.status = ["ok"] * len(group.trials)
        self.halving = sorted(group.config.sweep.halving_steps)
        self.rngs = None  # the trials' dropout keys [T], once restored
        self.judged: dict[int, str] = {}  # {trial index: reason}: the judge's stops, for adjust
        self.population = None if group.pbt is None else pbt.Population(group.pbt, group.hyper)
        self.evaluated: tuple[int, dict[int, dict]] = (-1, {})  # the latest evaluation's results

    def restore(self):
        """(state, start step): the group restored (iterators, statuses, keys) or fresh; each
        trial's records after `start` dropped and its config.json written."""
        state, self.rngs, start, data_states = self.group.initial(self.checkpointer)
        if data_states is not None:
            for seed, iterator in self.iterators.items():
                iterator.set_state(data_states["iterators"][str(seed)])
            self.status = list(data_states["status"])
            if self.population is not None:
                self.population.load(data_states["pbt"])
        self._drop_replayed(start)
        if self.population is not None and start == 0:
            self._write_pbt(0, None, {})
        for trial in self.group.trials:
            workdir_format.write_config_json(trial.workdir, trial.config)
        return state, start

    def _drop_replayed(self, start: int) -> None:
        loop.drop_replayed(self.writers, start)

    def place(self, state):
        return state  # `Group.initial` placed it

    def batch(self):
        batches = {seed: next(it) for seed, it in self.iterators.items()}
        if self.group.shared_batch:
            return self.group.placement.put_batch(batches[self.group.seeds[0]])
        rows = [batches[seed] for seed in self.group.seeds]
        return self.group.placement.put_batch(jax.tree.map(lambda *x: np.stack(x), *rows))

    def step(self, state, batch):
        hyper = self.group.hyper if self.population is None else self.population.hyper
        return self.group.step_fn(state, batch, self.rngs, hyper)

    def startup(self, step: int, record) -> None:
        for i, writer in enumerate(self.writers):
            if self.status[i] == "ok":
                writer.write(step, "startup", record)

    def log(self, pending: list, step: int, t0: float, untimed: int):
        """Writes each live trial's train record; times the steps since `t0` to their end
        (dispatch is asynchronous: waiting for the metrics first). Shows the best trial."""
        fetched = jax.device_get(pending)  # [steps] of {name: [T]}
        elapsed = time.perf_counter() - t0
        live = np.stack([m["live"] for m in fetched])  # [steps, T]
        best = None
        for i, writer in enumerate(self.writers):
            if self.status[i] != "ok":
                continue
            if not live[:, i].all():
                self._frozen(i, step - len(fetched) + 1 + int(np.argmin(live[:, i])), fetched)
                continue
            summary = vsweep_state.trial_summary(
                [{k: v[i] for k, v in m.items()} for m in fetched], elapsed, untimed
            )
            writer.write(step, "train", summary)
            best = summary if best is None or summary["loss"] < best["loss"] else best
        return best

    def _frozen(self, index: int, step: int, fetched) -> None:
        self.status[index] = f"frozen at step {step} (non-finite loss)"
        loss = [float(m["loss_sum"][index]) for m in fetched]
        log.warning(
            "trial %s %s; loss sums %s; the others go on",
            self.group.trials[index].name,
            self.status[index],
            loss,
        )

    def evaluate(self, state, step: int) -> None:
        results = {}
        for i, (run, writer) in enumerate(zip(self.group.runs, self.writers, strict=True)):
            if self.status[i] == "ok":
                params = self.group.placement.trial_params(state, i)
                result = evaluator.evaluate(run, params, max_examples=self.tcfg.max_eval_examples)
                writer.write(step, "eval", result)
                results[i] = result
        if self.group.judge is not None:
            self.judged = self.group.judge(step, results)
        self.evaluated = (step, results)

    def adjust(self, state, step: int):
        if self.judged:
            state, self.judged = self._stop(state, step, self.judged), {}
        if self.population is not None and self.population.due(step, self.tcfg.num_train_steps):
            return self._exploit_and_explore(state, step)
        return self._halve(state, step) if step in self.halving else state

    def _stop(self, state, step: int, reasons: dict[int, str]):
        """Stops trials {index: reason}: their updates masked from the next step on."""
        mask = np.zeros(len(self.status), bool)
        for i, reason in reasons.items():
            self.status[i] = f"stopped at step {step} ({reason})"
            log.info("trial %s %s", self.group.trials[i].name, self.status[i])
            mask[i] = True
        return vectorized.freeze(state, self.group.placement.put_trials(mask))

    def _exploit_and_explore(self, state, step: int):
        """PBT on this step's evaluation (evaluating unless the loop just did)."""
        if self.evaluated[0] != step:
            self.evaluate(state, step)
        return pbt.act(self, state, step)

    def _write_pbt(self, step: int, source, scores: dict[int, float]) -> None:
        pbt.write_records(self, step, source, scores)

    def _halve(self, state, step: int):
        """Successive halving: keeps the better half of the live trials by eval loss."""
        live = [i for i, s in enumerate(self.status) if s == "ok"]
        eval_loss = {}
        for i in live:
            params = self.group.placement.trial_params(state, i)
            run = self.group.runs[i]
            eval_loss[i] = evaluator.evaluate(
                run, params, max_examples=self.tcfg.max_eval_examples
            )["loss"]
        ranked = sorted(live, key=lambda i: (not math.isfinite(eval_loss[i]), eval_loss[i]))
        stop = ranked[math.ceil(len(live) / 2) :]
        reasons = {i: f"successive halving, eval loss {eval_loss[i]:.4g}" for i in stop}
        return self._stop(state, step, reasons)

    def save(self, state, step: int, pending: list) -> None:
        """Saves the group (a frozen trial's non-finite state included: it is not checked)."""
        data = {str(seed): it.get_state() for seed, it in self.iterators.items()}
        extra = {} if self.population is None else {"pbt": self.population.state_dict()}
        vsweep_state.save(
            self.checkpointer, self.group, state, self.rngs, step, data, self.status, extra
        )

    def finish(self, state, step: int) -> list[Outcome]:
        """Each trial's final evaluation, records and hyperparameters; their outcomes."""
        outcomes = []
        for i, (trial, run, writer) in enumerate(
            zip(self.group.trials, self.group.runs, self.writers, strict=True)
        ):
            result = evaluator.evaluate(run, self.group.placement.trial_params(state, i))
            writer.write(step, "final_eval", result)
            writer.write_hparams(hparams(trial.config), result, step)
            writer.close()
            outcomes.append(Outcome(self.status[i], result))
        if self.population is not None:
            pbt.write_lineage(self.group.directory, self.group.trials, self.population)
        return outcomes
