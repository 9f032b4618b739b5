"""`train_and_evaluate(config, workdir)`: build, restore, loop (step, log, eval, save), final eval.

The loop is `tfjax.runs.loop`'s, the one a vectorised sweep's trials train through too; this
module gives it a run's hooks (`_RunHooks`: the strategy's batches and compiled step, the run's
records, evaluations and checkpoints, the checks that stop a diverged run).

One code path from a laptop CPU to a TPU pod (docs/design.md, "One code path from CPU to pod").
The run is resumable: rerunning with the same workdir restores the latest good checkpoint
(state, dropout key, data-iterator position) and continues with exactly the batches that would
have come next. SIGTERM (preemption) saves a checkpoint and returns; before the first step
(while the run is built, restored and compiled) it returns at once, saving nothing, with a
warning that says so. A workdir whose config.json is damaged is not resumed while checkpoints
depend on it (the error says how to repair it). A non-finite loss, gradient or parameter stops
the run (`tfjax.errors.DivergedError`) before anything is saved over the last good checkpoint:
every save first checks the state it writes. One run at a time: the workdir is locked
(`tfjax.runs.lock`). A new run with `train.init_from` starts from the parameters of another
workdir or of a Hugging Face checkpoint (`tfjax.runs.pretrained`), with fresh optimizer moments.

Multi-process runs (`tfjax.parallel.distributed`) take the same road in every process: each
feeds its rows of every global batch, and all of them save and restore the checkpoints (orbax
writes each process's shards); only process 0 writes `config.json`, metrics and TensorBoard.
A SIGTERM to any process stops all of them at one agreed step, after a checkpoint; a collective
that fails because a process died, wherever it is (a step, an evaluation, orbax's barriers while
saving or restoring), raises `tfjax.errors.DistributedError` (`experiments.cli` then ends the
process at once: JAX's shutdown would wait for the dead peer).
"""

import contextlib
import dataclasses
import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from tfjax import errors
from tfjax.data import datasets, pipeline
from tfjax.models import kinds
from tfjax.nn import losses
from tfjax.parallel import distributed, strategies
from tfjax.runs import (
    build,
    evaluator,
    lock,
    pretrained,
    restoration,
    validation,
    workdir_format,
)
from tfjax.runs import loop as loop_lib
from tfjax.runs.loop import Preemption, Terminated
from tfjax.training import checkpointing, logger, mlm, profiling, steps, storage

log = logging.getLogger(__name__)


def _initial_state(run: build.Run, checkpointer, iterator, workdir: pathlib.Path):
    """(state, dropout rng, start step): restored from the workdir, or freshly initialised."""
    init_rng, dropout_rng = jax.random.split(jax.random.key(run.config.seed))
    try:
        restored = checkpointer.restore(
            run.strategy.restore_target(run.abstract_state),
            convert=workdir_format.layout_conversion(run.model_config),
        )
    except checkpointing.CheckpointMismatchError as err:
        raise restoration.explain_mismatch(err, run, workdir, config_file=False) from err
    if restored is None and run.config.train.init_from:
        params = jax.tree.map(jnp.asarray, pretrained.initial_params(run.config, run))
        log.info("starting from the parameters of %s", run.config.train.init_from)
        state = steps.TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=run.optimizer.init(params)
        )
        return state, dropout_rng, 0
    if restored is None:
        sample = jax.tree.map(lambda x: jnp.asarray(x[None]), run.examples.train[0])
        state = jax.jit(
            lambda rng: steps.create_train_state(
                run.model, run.optimizer, rng, sample, run.model_config.kind
            )
        )(init_rng)
        return state, dropout_rng, 0
    iterator.set_state(restored.data_state)
    log.info("resumed from %s at step %d", workdir / "checkpoints", restored.step)
    return restored.state, restored.rng, restored.step


_LOWER = (
    "Lower optim.learning_rate, set optim.grad_clip_norm, or use float32 compute (model.dtype), "
    "then rerun: it resumes from the last good checkpoint."
)


def _diverged(what: str, checkpointer, fix: str = _LOWER) -> errors.DivergedError:
    """The error of a run that diverged: `what` happened, which checkpoint is kept, `fix`."""
    latest = checkpointer.latest_step()
    kept = f"the last good checkpoint is step {latest}" if latest is not None else "none saved yet"
    return errors.DivergedError(f"{what}. Nothing was saved after it ({kept}). {fix}")


# What to do about steps that scored no token (loss 0/0), by whether the run is masked-LM.
_NO_TOKEN_FIX = {
    True: "A masked-LM run scores only tokens it can mask: train on text the tokenizer's "
    "vocabulary covers.",
    False: "Every target token of those steps was padding or left out of the loss: check that "
    "the training examples have targets.",
}


def _masked_lm(run: build.Run) -> bool:
    kind, head = run.model_config.kind, run.model_config.encoder_head
    return kinds.get(kind).example_format(head) == datasets.MLM


def _check_finite(
    sums: dict[str, float], step: int, checkpointer, *, masked_lm: bool = False
) -> None:
    """Raises DivergedError for a non-finite loss or gradient in `sums`, or a loss of 0/0 (no
    token scored: e.g. a masked-LM run with nothing it can mask)."""
    if sums.get("weight_sum") == 0:
        raise _diverged(
            f"no token was scored in the steps up to step {step}, so the loss is 0/0 (nan)",
            checkpointer,
            _NO_TOKEN_FIX[masked_lm],
        )
    if np.isfinite(sums.get("loss_sum", 0.0)) and np.isfinite(sums.get("grad_norm", 0.0)):
        return
    raise _diverged(
        f"non-finite loss or gradient before step {step} (loss_sum={sums.get('loss_sum')}, "
        f"grad_norm={sums.get('grad_norm')})",
        checkpointer,
    )


@jax.jit
def _all_finite(tree) -> jax.Array:
    """True (a bool scalar) when every floating-point element of `tree` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves] or [jnp.bool_(True)]))


def _fetch(pending: list) -> dict[str, float]:
    """Host sums over the steps since the last log (the only place the loop waits on devices)."""
    fetched = jax.device_get(pending)
    return evaluator.host_sum(
        {k: np.stack([m[k] for m in fetched]) for k in pending[0]}, across_hosts=False
    )


def _log_train(
    writer,
    pending: list,
    step: int,
    elapsed: float,
    checkpointer,
    untimed: int = 0,
    masked_lm: bool = False,
):
    """Logs the pending steps; the first `untimed` of them (compilation) are not in `elapsed`."""
    sums = _fetch(pending)
    if not untimed:
        timed = sums
    else:  # nothing timed yet when the first window is only the compiled step
        timed = _fetch(pending[untimed:]) if len(pending) > untimed else {}
    _check_finite(sums, step, checkpointer, masked_lm=masked_lm)
    summary = losses.summarize(
        {k: v for k, v in sums.items() if k not in ("grad_norm", "learning_rate")}
    )
    summary["grad_norm"] = sums["grad_norm"] / len(pending)
    summary["learning_rate"] = float(jax.device_get(pending[-1]["learning_rate"]))
    summary["tokens_per_second"] = timed.get("weight_sum", 0.0) / max(elapsed, 1e-9)
    summary["steps_per_second"] = (len(pending) - untimed) / max(elapsed, 1e-9)
    writer.write(step, "train", summary)
    return summary


def _save(run, checkpointer, state, step: int, rng, iterator, pending: list) -> None:
    """Checks the steps since the last log and the state to be saved (parameters and optimizer
    state: a step's metrics come before its update) are finite, then saves asynchronously."""
    if pending:
        _check_finite(_fetch(pending), step, checkpointer, masked_lm=_masked_lm(run))
    saved = run.strategy.checkpoint_state(state)
    if not bool(_all_finite(saved)):
        raise _diverged(f"non-finite parameters or optimizer state after step {step}", checkpointer)
    checkpointer.save(
        step,
        saved,
        rng=rng,
        data_state=iterator.get_state(),
        config=workdir_format.stamped(workdir_format.config_dict(run.config)),
        force=True,
    )


@dataclasses.dataclass
class _RunHooks:
    """What the training loop (`tfjax.runs.loop`) does for one run: its batches and compiled
    step, its records in `WORKDIR/metrics.jsonl`, its evaluations and checkpoints; a run is
    never adjusted between steps."""

    run: build.Run
    iterator: pipeline.BatchIterator
    writer: logger.MetricWriter
    checkpointer: checkpointing.Checkpointer
    rng: jax.Array

    def place(self, state):
        return self.run.strategy.put_state(state)

    def batch(self):
        return self.run.strategy.put_batch(next(self.iterator))

    def step(self, state, batch):
        return self.run.train_step(state, batch, self.rng)

    def startup(self, step: int, record) -> None:
        self.writer.write(step, "startup", record)

    def log(self, pending: list, step: int, t0: float, untimed: int):
        elapsed = time.perf_counter() - t0  # dispatch is asynchronous: steps may still run
        return _log_train(
            self.writer,
            pending,
            step,
            elapsed,
            self.checkpointer,
            untimed,
            masked_lm=_masked_lm(self.run),
        )

    def evaluate(self, state, step: int) -> None:
        params = self.run.strategy.host_params(state)
        max_examples = self.run.config.train.max_eval_examples
        self.writer.write(
            step, "eval", evaluator.evaluate(self.run, params, max_examples=max_examples)
        )

    def adjust(self, state, step: int):
        return state

    def save(self, state, step: int, pending: list) -> None:
        _save(self.run, self.checkpointer, state, step, self.rng, self.iterator, pending)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, checked: bool = False
) -> dict[str, float]:
    """Trains `config` in `workdir` (resuming from its checkpoints); returns final eval metrics.

    `checked`: the caller has already passed `config` through `validation.check_config` (as
    `experiments.train` does before it starts JAX), so it is not checked again.

    The workdir is locked for the whole run (`tfjax.runs.lock`): a second run on it, in this
    process or another, raises `WorkdirLockedError` before writing anything. A SIGTERM stops
    the run: in the loop after saving a checkpoint, before it at once; either way the result
    is {} and a warning says where the run stopped.

    Raises:
        tfjax.errors.UserError: for what the user can fix: a config value, a data file, a
            workdir that is a file or in use, a damaged config.json next to checkpoints,
            incompatible checkpoints, a diverged loss.
    """
    if not checked:  # a bad value stops the run before the workdir is touched
        validation.check_config(config)
    strategies.host_batch_size(config.train.global_batch_size)  # divides over the devices?
    workdir = make_workdir(pathlib.Path(workdir))
    try:
        with Preemption(early=True) as preemption, lock.held(workdir):  # lock: before writing
            with _peers_watched():  # a peer lost while the run is built or restored
                return _train_and_evaluate(config, workdir, preemption)
    except Terminated:
        log.warning("stopped by SIGTERM before the first step: %s", _nothing_saved(workdir))
        return {}


def _nothing_saved(workdir: pathlib.Path) -> str:
    """What a run stopped before its first step leaves, and how to go on."""
    steps = workdir_format.saved_steps(workdir)
    if not steps:
        return "no checkpoint was saved; rerun the same command to start"
    return (
        f"nothing new was saved (the newest checkpoint is still step {steps[-1]}); rerun the "
        "same command to resume"
    )


def make_workdir(workdir: pathlib.Path) -> pathlib.Path:
    """Creates `workdir`, or says in one line why it cannot be one (a file, a read-only mount:
    an existing workdir is probed with a file write before anything is restored)."""
    for path in (workdir, *workdir.parents):
        if path.exists():
            if not path.is_dir():
                raise errors.WorkdirError(
                    f"workdir {workdir}: {path} is a file, not a directory; move the file "
                    "away or choose another workdir"
                )
            break
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise errors.WorkdirError(
            f"cannot create workdir {workdir}: {err.strerror}; choose another workdir"
        ) from err
    storage.check_writable(workdir, f"workdir {workdir}")
    return workdir


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: pathlib.Path, preemption):
    chief = jax.process_index() == 0
    workdir_format.check_config_json(workdir)
    workdir_format.check_checkpoint_settings(config, workdir)  # before the tokenizer is read
    if config.train.init_from and chief:  # the tokenizer of a pretrained model, before `build`
        pretrained.prepare_workdir(config, workdir)
    run = build.build(config, workdir)
    if chief:
        size = sum(leaf.size for leaf in jax.tree.leaves(run.abstract_state.params))
        log.info("model %s: %s parameters", run.model_config.kind, f"{size:,}")
    run.examples.read()  # a resumed run's splits are deferred: their errors before any write
    _check_maskable(run)
    iterator = build.train_iterator(run)
    writer = logger.MetricWriter(workdir, enabled=chief)
    with checkpointing.Checkpointer(
        workdir / "checkpoints", max_to_keep=config.train.keep_checkpoints
    ) as checkpointer:
        state, rng, start = _initial_state(run, checkpointer, iterator, workdir)
        loop_lib.drop_replayed([writer], start)  # the steps this run logs again
        if chief:  # after the restore: a refused run leaves the workdir as it was
            workdir_format.write_config_json(workdir, config)
        hooks = _RunHooks(run, iterator, writer, checkpointer, rng)
        loop = loop_lib.Loop(hooks, config.train, checkpointer, step=start, chief=chief)
        trace = profiling.StepTrace(
            config.train.profile_steps, workdir / profiling.PROFILE_DIR, start=start, enabled=chief
        )
        with _peers_watched(loop):
            state, step = loop.run(state, start, preemption, trace)
            if preemption.requested:
                writer.close()
                return {}
            result = evaluator.evaluate(
                run,
                run.strategy.host_params(state),
                max_examples=config.train.final_eval_examples,
            )
    if step == start:  # a rerun of a finished run evaluates its last step again (a record
        writer.drop(step, "final_eval")  # after `start` was dropped by `drop_after`)
    writer.write(step, "final_eval", result)
    writer.close()
    return result


def _check_maskable(run: build.Run) -> None:
    """A masked-LM run: refuses splits with no token to mask (`mlm.check_maskable`)."""
    masking = build.make_masking(run.config, run.examples.tokenizer)
    if masking is None:
        return
    unk_id = run.examples.tokenizer.unk_id
    for split, rows in (("training", run.examples.train), ("evaluation", run.examples.eval)):
        mlm.check_maskable(rows, masking, split=split, unk_id=unk_id)


@contextlib.contextmanager
def _peers_watched(loop: "loop_lib.Loop | None" = None):
    """Multi-process runs: a collective failed by a dead process becomes a DistributedError.

    Collectives fail in more than one type: JAX's own as `JaxRuntimeError`, those orbax runs
    while saving (`sync_global_processes`) as a `ValueError` or `RuntimeError` carrying gloo's
    text ("UNKNOWN: Gloo AllGather failed: ... Connection reset by peer"); each is recognised
    by its words (`distributed.is_peer_failure`). Errors the user caused pass unchanged.
    """
    try:
        yield
    except (RuntimeError, ValueError) as err:  # JaxRuntimeError is a RuntimeError
        if (
            jax.process_count() == 1
            or isinstance(err, errors.UserError)
            or not distributed.is_peer_failure(err)
        ):
            raise
        raise distributed.peer_lost(
            err,
            process=jax.process_index(),
            count=jax.process_count(),
            step=None if loop is None else loop.step,
        ) from err
