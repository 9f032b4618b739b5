"""The pieces of a vectorised sweep (`tfjax.runs.vsweep`) around its state: data, placement,
checkpoints of the whole group, and extracting one trial as an ordinary workdir.

A group checkpoint holds the `SweepState` (every leaf [T, ...]), the trials' dropout keys [T],
the data iterators' positions and each trial's status (`data_state`), and the trials' names and
configs (`config`). `extract` turns trial i of it into the checkpoint a run trained alone would
have written: its slice of the state (with the optimizer-state structure of its own config),
its dropout key, its iterator position and its config.
"""

import dataclasses
import math
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tfjax import errors
from tfjax.data import datasets
from tfjax.nn import losses
from tfjax.runs import build, evaluator, run_data, workdir_format
from tfjax.training import checkpointing, mup, optim, steps, vectorized

CHECKPOINTS = "checkpoints"


def load_examples(trials: Sequence[Any], trained: bool) -> dict[int, datasets.Examples]:
    """The examples of each distinct seed; every trial's workdir gets the tokenizer.

    `trained`: the group has checkpoints (in its own directory, not the trials' workdirs),
    so each seed's tokenizer must be there and match its record (`run_data.load_examples`).

    Raises:
        tfjax.errors.ConfigError: if two seeds give tokenizers of different sizes (the
            vocabulary is a shape: sweep such seeds without --vectorize).
    """
    examples, first = {}, {}
    for trial in trials:
        seed = trial.config.seed
        if seed not in examples:
            # Read now (a resumed sweep's are deferred): data errors before anything is written.
            examples[seed] = run_data.load_examples(trial.config, trial.workdir, trained).read()
            first[seed] = trial.workdir
        else:
            _copy_tokenizer(first[seed], trial.workdir)
    sizes = {seed: e.tokenizer.vocab_size for seed, e in examples.items()}
    if len(set(sizes.values())) > 1:
        raise errors.ConfigError(
            f"the seeds' data give vocabularies of different sizes {sizes}: they cannot train "
            "in one vectorised program; sweep them without --vectorize"
        )
    return examples


def _copy_tokenizer(source: pathlib.Path, target: pathlib.Path) -> None:
    for name in (datasets.TOKENIZER_FILE, datasets.SENTENCEPIECE_FILE):
        if (source / name).exists() and not (target / name).exists():
            shutil.copyfile(source / name, target / name)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the group's arrays live: a ("trial", "data") mesh, or one device."""

    mesh: Mesh | None
    shared_batch: bool

    @classmethod
    def create(cls, num_trials: int, batch_size: int, *, shared_batch: bool) -> "Placement":
        devices = jax.local_devices()
        trial, data = mesh_shape(num_trials, len(devices), batch_size)
        if trial * data == 1:
            return cls(None, shared_batch)
        grid = np.asarray(devices[: trial * data]).reshape(trial, data)
        return cls(Mesh(grid, ("trial", "data")), shared_batch)

    def _sharding(self, *spec) -> NamedSharding | None:
        return None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec(*spec))

    def _batch_spec(self) -> tuple:
        return ("data",) if self.shared_batch else ("trial", "data")

    def jit(self, step):
        """The vectorised step jitted with the group's shardings; the state is donated."""
        if self.mesh is None:
            return jax.jit(step, donate_argnums=0)
        trials, batch = self._sharding("trial"), self._sharding(*self._batch_spec())
        return jax.jit(
            step,
            in_shardings=(trials, batch, trials, trials),
            out_shardings=(trials, trials),
            donate_argnums=0,
        )

    def put_state(self, state: Any) -> Any:
        return state if self.mesh is None else jax.device_put(state, self._sharding("trial"))

    def put_trials(self, values: np.ndarray) -> jax.Array:
        return self.put_state(jnp.asarray(values))

    def put_batch(self, batch: dict) -> dict:
        if self.mesh is None:
            return batch
        return jax.device_put(batch, self._sharding(*self._batch_spec()))

    def place_abstract(self, abstract: Any) -> Any:
        """`abstract` with the trial sharding on every leaf (a restore target)."""
        sharding = self._sharding("trial")
        if sharding is None:
            return abstract
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract
        )

    @staticmethod
    def trial_params(state: vectorized.SweepState, index: int) -> Any:
        """Trial `index`'s parameters on the first local device (for evaluation)."""
        params = vectorized.unstack(state.train.params, index)
        return jax.device_put(params, jax.local_devices()[0])


def _sweep_config(group) -> dict:
    trials = [
        {"name": t.name, "config": workdir_format.config_dict(t.config)} for t in group.trials
    ]
    return workdir_format.stamped({"trials": trials})


def save(
    checkpointer, group, state, rngs, step: int, iterators: dict, status: list[str], extra=None
) -> None:
    """Saves the group's state, keys, iterator positions and trial statuses as `step`, and
    `extra` (JSON: population-based training's hyperparameters, key and lineage) beside them."""
    checkpointer.save(
        step,
        state,
        rng=rngs,
        data_state={"iterators": iterators, "status": list(status), **(extra or {})},
        config=_sweep_config(group),
        force=True,
    )


def restore(checkpointer, abstract: vectorized.SweepState, group):
    """The group's latest good checkpoint, or None; refuses another sweep's checkpoints, and
    checkpoints of another workdir format."""
    for saved in checkpointer.saved_configs()[:1]:
        workdir_format.check_format(saved, checkpointer.directory)
        _check_same_trials(saved, _sweep_config(group), checkpointer.directory)
    return checkpointer.restore(abstract)


def check_trial_names(directory: pathlib.Path, trials) -> None:
    """Refuses a group directory whose newest checkpoint holds other trials, before the
    trials' data and tokenizers are read (their workdirs may not hold any yet)."""
    saved = workdir_format.newest_checkpoint_config(directory / "checkpoints")
    if saved is not None and "trials" in saved:
        _check_names(saved, [t.name for t in trials], directory / "checkpoints")


def _check_names(saved: dict, names: list[str], directory) -> None:
    saved_names = [t["name"] for t in saved["trials"]]
    if saved_names != names:
        raise errors.CheckpointError(
            f"{directory} holds the checkpoints of trials {saved_names}, not of {names}: use "
            "another --workdir for this sweep"
        )


def _check_same_trials(saved: dict, current: dict, directory) -> None:
    _check_names(saved, [t["name"] for t in current["trials"]], directory)
    for old, new in zip(saved["trials"], current["trials"], strict=True):
        workdir_format.check_resumable(old["config"], new["config"])


def abstract_state(run: build.Evaluable, structure: optim.TracedStructure, num_trials: int):
    """The group's `SweepState` as `jax.ShapeDtypeStruct`s, and the vmapped initialiser
    `init(rngs [T]) -> train state` (built from `run`: one trial's model and data)."""
    sample = jax.tree.map(lambda x: jnp.zeros((1, *x.shape), x.dtype), run.examples.train[0])
    hyper = optim.traced_hyper(build.optim_config(run.config), structure)
    multipliers = mup.lr_multipliers(run.model_config, structure.optimizer or "adam")
    optimizer, _ = optim.traced_optimizer(hyper, structure, run.model_config.embed_dim, multipliers)
    kind = run.model_config.kind
    init = jax.vmap(lambda rng: steps.create_train_state(run.model, optimizer, rng, sample, kind))
    rngs = jax.ShapeDtypeStruct((num_trials,), jax.random.key(0).dtype)
    abstract = vectorized.SweepState(
        train=jax.eval_shape(init, rngs), live=jax.ShapeDtypeStruct((num_trials,), jnp.bool_)
    )
    return abstract, init


def extract(directory: str | pathlib.Path, workdir: str | pathlib.Path) -> int:
    """Writes the trial whose workdir is `workdir`, of the group checkpointed in `directory`,
    into `workdir/checkpoints` as the checkpoint a run alone would have written (the group's
    latest step, which it returns). `experiments.train` then resumes it like any run.

    Raises:
        tfjax.errors.CheckpointError: for no checkpoint, or a workdir that is none of its
            trials'.
    """
    directory, workdir = pathlib.Path(directory), pathlib.Path(workdir)
    config = workdir_format.load_config_json(workdir / "config.json")
    with checkpointing.Checkpointer(directory / CHECKPOINTS) as group_checkpoints:
        saved = group_checkpoints.saved_configs()
        if not saved:
            raise errors.CheckpointError(
                f"no checkpoint in {directory / CHECKPOINTS}: run the vectorised sweep first"
            )
        workdir_format.check_format(saved[0], directory / CHECKPOINTS)
        trials = saved[0]["trials"]
        index = _trial_index(trials, workdir_format.config_dict(config), workdir, directory)
        run = build.build(config, workdir)
        configs = [workdir_format.load_config_dict(t["config"]) for t in trials]
        structure = optim.traced_structure([build.optim_config(c) for c in configs])
        abstract, _ = abstract_state(run, structure, len(trials))
        restored = group_checkpoints.restore(abstract)
    own = _as_structure(vectorized.unstack(restored.state.train, index), run.abstract_state)
    with checkpointing.Checkpointer(workdir / CHECKPOINTS) as checkpointer:
        if restored.step in checkpointer.all_steps():
            return restored.step  # extracted before
        checkpointer.save(
            restored.step,
            own,
            rng=restored.rng[index],
            data_state=restored.data_state["iterators"][str(config.seed)],
            config=workdir_format.stamped(workdir_format.config_dict(config)),
            force=True,
        )
    return restored.step


def _trial_index(trials: list[dict], config: dict, workdir, directory) -> int:
    for index, trial in enumerate(trials):
        if workdir_format.config_dict(workdir_format.load_config_dict(trial["config"])) == config:
            return index
    raise errors.CheckpointError(
        f"{workdir} is not a trial of the sweep checkpointed in {directory} (its config.json "
        f"matches none of {[t['name'] for t in trials]})"
    )


def _as_structure(trial_state: Any, target: Any) -> Any:
    """A trial's state in the optimizer-state structure of its own config: the group's
    optimizer may hold empty states (clipping, weight decay) the trial's own does not."""
    leaves, target_leaves = jax.tree.leaves(trial_state), jax.tree.leaves(target)
    shapes = [(x.shape, x.dtype) for x in leaves]
    if shapes != [(x.shape, x.dtype) for x in target_leaves]:
        raise errors.CheckpointError(
            "the trial's state does not match its own config's layout; was the sweep "
            "checkpointed by another version of tfjax?"
        )
    return jax.tree.unflatten(jax.tree.structure(target), leaves)


def mesh_shape(num_trials: int, num_devices: int, batch_size: int) -> tuple[int, int]:
    """(trial, data) mesh sizes: trials spread over as many devices as divide them, and the
    devices left over (as many as divide the batch) data-parallel within each trial."""
    trial = math.gcd(num_trials, num_devices)
    rest = num_devices // trial
    data = max(d for d in range(1, rest + 1) if rest % d == 0 and batch_size % d == 0)
    return trial, data


def trial_summary(pending: list[dict], elapsed: float, untimed: int) -> dict[str, float]:
    """One trial's train record over the steps since the last log, as `trainer`
    writes it for a run alone."""
    stacked = {k: np.stack([m[k] for m in pending]) for k in pending[0] if k != "live"}
    sums = evaluator.host_sum(stacked, across_hosts=False)
    timed = evaluator.host_sum({"w": stacked["weight_sum"][untimed:]}, across_hosts=False)["w"]
    summary = losses.summarize(
        {k: v for k, v in sums.items() if k not in ("grad_norm", "learning_rate")}
    )
    summary["grad_norm"] = sums["grad_norm"] / len(pending)
    summary["learning_rate"] = float(pending[-1]["learning_rate"])
    summary["tokens_per_second"] = timed / max(elapsed, 1e-9)
    summary["steps_per_second"] = (len(pending) - untimed) / max(elapsed, 1e-9)
    return summary
