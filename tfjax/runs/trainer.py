"""`train_and_evaluate(config, workdir)`: build, restore, loop (step, log, eval, save), final eval.

One code path from a laptop CPU to a TPU pod (STYLE.md §9). The run is resumable: rerunning with
the same workdir restores the latest good checkpoint (state, dropout key, data-iterator position)
and continues with exactly the batches that would have come next. SIGTERM (preemption) saves a
checkpoint and returns. A non-finite loss stops the run before anything is saved over the last
good checkpoint.
"""

import contextlib
import dataclasses
import json
import logging
import pathlib
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from tfjax import models
from tfjax.inference import decoding
from tfjax.nn import losses
from tfjax.parallel import strategies
from tfjax.training import checkpointing, logger, optim, steps
from tfjax.data import datasets, pipeline, tokenizers

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Run:
    """Everything the loop needs, built once from the config."""

    config: ml_collections.ConfigDict
    model_config: models.ModelConfig
    model: Any
    examples: datasets.Examples
    strategy: Any
    train_step: Any
    eval_step: Any
    abstract_state: Any
    optimizer: Any
    greedy: Any  # jitted (params, inputs, segment_ids) -> [B, L] ids, seq2seq runs only


def config_dict(config: ml_collections.ConfigDict) -> dict:
    """JSON-safe nested dict of a config (tuples become lists)."""
    return json.loads(config.to_json_best_effort())


def _build(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> _Run:
    examples = datasets.load(
        datasets.DataConfig(**config.data), config.model.kind, seed=config.seed, workdir=workdir
    )
    fields = config.model.to_dict()
    fields["vocab_size"] = fields["vocab_size"] or examples.tokenizer.vocab_size
    model_config = models.ModelConfig(**fields)
    model = models.create_model(model_config)
    optim_fields = config.optim.to_dict()
    if optim_fields["schedule"] == "cosine" and not optim_fields["decay_steps"]:
        # 0 = decay over the whole run, counted in applied updates.
        optim_fields["decay_steps"] = (
            config.train.num_train_steps // optim_fields["grad_accum_steps"]
        )
    optim_config = optim.OptimConfig(**optim_fields)
    optimizer, schedule = optim.make_optimizer(optim_config, model_config.embed_dim)
    strategy = strategies.create(config.parallel.mode, fsdp=config.parallel.fsdp)
    sample = jax.tree.map(lambda x: jnp.zeros((1, *x.shape), x.dtype), examples.train[0])
    abstract_state = jax.eval_shape(
        lambda: steps.create_train_state(
            model, optimizer, jax.random.key(0), sample, model_config.kind
        )
    )
    kind, smoothing = model_config.kind, config.train.label_smoothing
    train_step = steps.make_train_step(
        model,
        optimizer,
        schedule,
        kind=kind,
        label_smoothing=smoothing,
        grad_accum_steps=optim_config.grad_accum_steps,
    )
    eval_step = jax.jit(steps.make_eval_step(model, kind=kind, label_smoothing=smoothing))
    return _Run(
        config,
        model_config,
        model,
        examples,
        strategy,
        strategy.compile_train_step(train_step, abstract_state),
        eval_step,
        abstract_state,
        optimizer,
        _make_greedy(model, config.data.max_target_len),
    )


def _make_greedy(model, max_length: int):
    """Cached greedy decoding (`decoding.generate`), jitted once per run."""

    def greedy(params, inputs, segment_ids):
        return decoding.generate(
            model,
            params,
            inputs=inputs,
            inputs_segment_ids=segment_ids,
            max_length=max_length,
            eos_id=tokenizers.EOS_ID,
        )

    return jax.jit(greedy)


def restore(
    config: ml_collections.ConfigDict,
    workdir: str | pathlib.Path,
    step: int | None = None,
    *,
    average_last: int = 1,
) -> tuple[_Run, checkpointing.Restored]:
    """The run built from `config` and its checkpoint `step` (default: the latest good one).

    `average_last=N > 1` instead averages the parameters of the last N saved checkpoints
    (`Checkpointer.restore_average`); `step` must then be None.

    Raises:
      FileNotFoundError: if `workdir` has no checkpoint.
      ValueError: for `average_last` with a `step`, or more checkpoints than are saved.
    """
    workdir = pathlib.Path(workdir)
    if average_last > 1 and step is not None:
        raise ValueError("average the last checkpoints or restore one step, not both")
    run = _build(config, workdir)
    with checkpointing.Checkpointer(workdir / "checkpoints") as checkpointer:
        if average_last > 1 and checkpointer.all_steps():
            restored = checkpointer.restore_average(run.abstract_state, last=average_last)
        else:
            restored = checkpointer.restore(run.abstract_state, step=step)
    if restored is None:
        raise FileNotFoundError(
            f"no checkpoint in {workdir / 'checkpoints'}: train first with "
            f"python -m experiments.train --workdir={workdir}"
        )
    return run, restored


def _train_iterator(run: _Run) -> pipeline.BatchIterator:
    batch_size = strategies.host_batch_size(run.config.train.global_batch_size)
    dataset = pipeline.make_dataset(
        run.examples.train,
        batch_size=batch_size,
        seed=run.config.seed,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
    )
    return pipeline.BatchIterator(dataset)


def _initial_state(run: _Run, checkpointer, iterator, workdir: pathlib.Path):
    """(state, dropout rng, start step): restored from the workdir, or freshly initialised."""
    init_rng, dropout_rng = jax.random.split(jax.random.key(run.config.seed))
    current = config_dict(run.config)
    for saved in checkpointer.saved_configs()[:1]:
        for section in ("model", "data"):
            checkpointing.check_compatible(saved, current, section=section)
    restored = checkpointer.restore(run.abstract_state)
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


def _host_sum(metrics: dict[str, Any], *, across_hosts: bool) -> dict[str, float]:
    """Sums metric arrays on the host; `across_hosts` also sums over processes.

    Train metrics are already global (summed over every device inside the step); evaluation
    sums come from each host's own slice of the eval split and need the cross-host sum.
    """
    sums = {k: float(np.sum(v)) for k, v in metrics.items()}
    if across_hosts and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.array(list(sums.values())))
        sums = dict(zip(sums, np.asarray(gathered).sum(0).tolist(), strict=True))
    return sums


def evaluate(
    run: _Run, params: Any, *, max_examples: int = 0, examples: list | None = None
) -> dict[str, float]:
    """Teacher-forced loss/accuracy on the eval split, plus greedy exact match for seq2seq.

    `examples` replaces the eval split (e.g. sampled LM windows); seq2seq runs then report no
    BLEU, which needs the split's references.
    """
    references = run.examples.references if examples is None else None
    if examples is None:
        examples = run.examples.eval
    examples = examples[:max_examples] if max_examples else examples
    dataset = pipeline.make_dataset(
        examples,
        batch_size=run.config.train.eval_batch_size,
        seed=0,
        shuffle=False,
        repeat=False,
        drop_remainder=False,
        shard_index=jax.process_index(),
        shard_count=jax.process_count(),
    )
    totals: dict[str, Any] = {}
    hypotheses: list[str] = []
    for batch in dataset:
        metrics = jax.device_get(run.eval_step(params, batch))
        if run.examples.format == "seq2seq":
            metrics.update(_greedy_exact_match(run, params, batch, hypotheses, references))
        totals = {k: totals.get(k, 0.0) + np.asarray(v) for k, v in metrics.items()}
    sums = _host_sum(totals, across_hosts=True)
    result = losses.summarize({k: v for k, v in sums.items() if not k.startswith("greedy_")})
    if "greedy_correct" in sums:
        result["greedy_exact_match"] = sums["greedy_correct"] / max(sums["greedy_count"], 1.0)
    if references is not None and jax.process_count() == 1:
        from tfjax.inference import evaluation  # sacrebleu, only for runs that keep references

        result["greedy_bleu"] = evaluation.bleu(hypotheses, references[: len(hypotheses)])
    return result


def _greedy_exact_match(
    run: _Run, params: Any, batch: dict[str, np.ndarray], hypotheses: list[str], references
) -> dict:
    """Greedy exact-match sums of a batch; appends the rows' detokenized outputs to `hypotheses`."""
    predictions = np.asarray(run.greedy(params, batch["inputs"], batch["inputs_segment_ids"]))
    targets, valid = batch["targets"], batch["targets_segment_ids"] > 0
    rows = valid.any(axis=1)
    correct = np.all((predictions == targets) | ~valid, axis=1) & np.all(
        (predictions == 0) | valid, axis=1
    )
    if references is not None:
        hypotheses += [run.examples.tokenizer.decode(row) for row in predictions[rows]]
    return {"greedy_correct": float(np.sum(correct & rows)), "greedy_count": float(rows.sum())}


class _Preemption:
    """Turns SIGTERM into a flag the loop checks between steps (main thread only)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        log.warning("SIGTERM received: saving a checkpoint and stopping")
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _check_finite(sums: dict[str, float], step: int, checkpointer) -> None:
    if np.isfinite(sums.get("loss_sum", 0.0)) and np.isfinite(sums.get("grad_norm", 0.0)):
        return
    raise FloatingPointError(
        f"non-finite loss or gradient before step {step} (loss_sum={sums.get('loss_sum')}, "
        f"grad_norm={sums.get('grad_norm')}). Nothing was saved after it: the last good "
        f"checkpoint is step {checkpointer.latest_step()}. Lower optim.learning_rate, set "
        "optim.grad_clip_norm, or use float32 compute (model.dtype), then rerun to resume."
    )


def _fetch(pending: list) -> dict[str, float]:
    """Host sums over the steps since the last log (the only place the loop waits on devices)."""
    fetched = jax.device_get(pending)
    return _host_sum({k: np.stack([m[k] for m in fetched]) for k in pending[0]}, across_hosts=False)


def _log_train(
    writer, progress, pending: list, step: int, elapsed: float, checkpointer, untimed: int = 0
):
    """Logs the pending steps; the first `untimed` of them (compilation) are not in `elapsed`."""
    sums = _fetch(pending)
    if not untimed:
        timed = sums
    else:  # nothing timed yet when the first window is only the compiled step
        timed = _fetch(pending[untimed:]) if len(pending) > untimed else {}
    _check_finite(sums, step, checkpointer)
    summary = losses.summarize(
        {k: v for k, v in sums.items() if k not in ("grad_norm", "learning_rate")}
    )
    summary["grad_norm"] = sums["grad_norm"] / len(pending)
    summary["learning_rate"] = float(jax.device_get(pending[-1]["learning_rate"]))
    summary["tokens_per_second"] = timed.get("weight_sum", 0.0) / max(elapsed, 1e-9)
    summary["steps_per_second"] = (len(pending) - untimed) / max(elapsed, 1e-9)
    writer.write(step, "train", summary)
    progress.update(step, summary)
    return summary


def _save(run, checkpointer, state, step: int, rng, iterator, pending: list) -> None:
    """Checks the steps since the last log were finite, then saves asynchronously."""
    if pending:
        _check_finite(_fetch(pending), step, checkpointer)
    checkpointer.save(
        step,
        run.strategy.host_state(state),
        rng=rng,
        data_state=iterator.get_state(),
        config=config_dict(run.config),
        force=True,
    )


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str | pathlib.Path
) -> dict[str, float]:
    """Trains `config` in `workdir` (resuming from its checkpoints); returns final eval metrics."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    chief = jax.process_index() == 0
    tcfg = config.train
    run = _build(config, workdir)
    iterator = _train_iterator(run)
    writer = logger.MetricWriter(workdir, enabled=chief)
    with checkpointing.Checkpointer(
        workdir / "checkpoints", max_to_keep=tcfg.keep_checkpoints
    ) as checkpointer:
        state, rng, start = _initial_state(run, checkpointer, iterator, workdir)
        if chief:  # after the compatibility check: a refused run leaves the workdir as it was
            (workdir / "config.json").write_text(json.dumps(config_dict(config), indent=2))
        state = run.strategy.put_state(state)
        progress = logger.Progress(tcfg.num_train_steps, initial_step=start, enabled=chief)
        pending, t0, step = [], time.perf_counter(), start
        with _Preemption() as preemption:
            while step < tcfg.num_train_steps and not preemption.requested:
                batch = run.strategy.put_batch(next(iterator))
                state, metrics = run.train_step(state, batch, rng)
                step += 1
                if step == start + 1:  # keep compilation (step and tokens) out of tokens/s
                    jax.block_until_ready(metrics)
                    t0 = time.perf_counter()
                pending.append(metrics)
                if step % tcfg.log_every_steps == 0 or step == tcfg.num_train_steps:
                    elapsed = time.perf_counter() - t0
                    first_window = len(pending) == step - start
                    _log_train(
                        writer,
                        progress,
                        pending,
                        step,
                        elapsed,
                        checkpointer,
                        untimed=1 if first_window else 0,
                    )
                    pending, t0 = [], time.perf_counter()
                if tcfg.eval_every_steps and step % tcfg.eval_every_steps == 0:
                    eval_start = time.perf_counter()
                    params = run.strategy.host_state(state).params
                    writer.write(
                        step, "eval", evaluate(run, params, max_examples=tcfg.max_eval_examples)
                    )
                    t0 += time.perf_counter() - eval_start  # evaluation time is not train time
                if step % tcfg.checkpoint_every_steps == 0 or preemption.requested:
                    _save(run, checkpointer, state, step, rng, iterator, pending)
        progress.close()
        if preemption.requested:
            log.warning("stopped at step %d by SIGTERM; rerun the same command to resume", step)
            writer.close()
            return {}
        if checkpointer.latest_step() != step:
            _save(run, checkpointer, state, step, rng, iterator, pending)
        result = evaluate(run, run.strategy.host_state(state).params)
    writer.write(step, "final_eval", result)
    writer.close()
    return result
