"""Evaluate a trained run: `python -m experiments.evaluate --workdir=W [--beam_size=4]`.

Flags: `--split` (default: the run's `data.eval_split`; any split of the run's dataset, e.g.
"test2016" for multi30k, or "train"), `--average_last` (1; N > 1 averages the parameters of the
last N checkpoints),
`--beam_size` (4; 1 = greedy), `--alpha` (0.6, beam length penalty), `--step` (default: the
latest good checkpoint), `--max_examples` (0 = the whole split), `--batch_size` (64).

Reads `W/config.json`, restores the checkpoint, then
  * seq2seq runs: decodes the split and scores the detokenized hypotheses against the targets:
    sacreBLEU BLEU (13a tokenizer, cased) and chrF2, both 0-100, and exact match (0-1); adds the
    teacher-forced `loss`, `nll`, `perplexity`, `accuracy` (per token),
    `teacher_forced_exact_match` and `greedy_exact_match` of `trainer.evaluate`. Hypotheses go
    to `W/eval/<split>_step<N>_beam<k>.hyp.txt`, one line per example, in the split's order.
  * lm and classify runs: the teacher-forced metrics of `trainer.evaluate` (the same keys as
    the `eval` records of `metrics.jsonl`); language models on a text stream (e.g.
    tinyshakespeare) score the whole split in consecutive windows and also report
    `sampled_nll`, the mean loss over `--sample_windows` (2,400 = nanoGPT's 200 batches of 12)
    windows at random offsets, seed 0.
The scores are printed and written to `W/eval.json` (the latest evaluation: split, step,
beam_size, alpha, num_examples, the scores and the sacreBLEU signatures); a copy stays in
`W/eval/<split>_step<N>_beam<k>.json`. Runs on one host, CPU included.

This module defines its flags only when run as a script, so `experiments.translate` and
`experiments.generate` import `restore_workdir` and `CommandError` from it.
"""

import json
import logging
import pathlib
import sys
from typing import Any

from absl import app, flags
from absl import logging as absl_logging

from experiments import config_utils

FLAGS = flags.FLAGS
EVAL_FILE = "eval.json"
# What each model kind is trained from, and which tool decodes it.
TRAIN_EXAMPLES = {
    "encoder_decoder": "configs/base.py:cpu",
    "decoder_only": "configs/lm.py:cpu",
    "encoder_only": "configs/classify.py:cpu",
}
TOOLS = {
    "encoder_decoder": "experiments.translate",
    "decoder_only": "experiments.generate",
    "encoder_only": "experiments.evaluate",
}


class CommandError(Exception):
    """A request the command cannot serve; the message says why and what to run instead."""


def _train_hint(workdir: pathlib.Path, kind: str) -> str:
    return (
        f"train one first, e.g. python -m experiments.train --config={TRAIN_EXAMPLES[kind]} "
        f"--workdir={workdir} (rerunning that command resumes an interrupted run)"
    )


def load_workdir_config(workdir: str | pathlib.Path, *, tool: str, kinds: tuple[str, ...]):
    """The resolved config of the run in `workdir`, checked to hold a model of `kinds`.

    Args:
        workdir: the run directory given to `experiments.train`.
        tool: the calling module, e.g. "experiments.translate", for messages.
        kinds: the model kinds `tool` can use.

    Returns:
        The locked config read from `workdir/config.json`.

    Raises:
        CommandError: if the workdir holds no config or a model of another kind.
    """
    workdir = pathlib.Path(workdir)
    path = workdir / "config.json"
    if not path.is_file():
        raise CommandError(
            f"{workdir} holds no trained run ({path} is missing): {_train_hint(workdir, kinds[0])}"
        )
    config = config_utils.load_config_json(path)
    kind = config.model.kind
    if kind not in kinds:
        raise CommandError(
            f"{workdir} holds a model of kind {kind}, but {tool} needs one of kind "
            f"{' or '.join(kinds)}: "
            f"use python -m {TOOLS[kind]} --workdir={workdir}"
        )
    return config


def restore_workdir(
    workdir: str | pathlib.Path,
    *,
    tool: str,
    kinds: tuple[str, ...],
    step: int | None = None,
    split: str | None = None,
    average_last: int = 1,
) -> tuple[Any, Any]:
    """Restores the run in `workdir` for `tool`: `trainer.restore` with clear errors.

    Args:
        workdir, tool, kinds: see `load_workdir_config`.
        step: the checkpoint step (None: the latest good one).
        split: the examples `run.examples.eval` holds: the config's `data.eval_split` (None
            means that one), another split of the dataset (e.g. "test2016") or "train".
        average_last: average the parameters of the last N checkpoints (1 = no averaging).

    Returns:
        (run, restored) of `trainer.restore`; the parameters are `restored.state.params`.

    Raises:
        CommandError: for a missing config or checkpoint, a model of another kind or an
            unknown split.
    """
    config = load_workdir_config(workdir, tool=tool, kinds=kinds)
    from tfjax.data import datasets

    named = datasets.eval_splits(config.data.name)
    allowed = tuple(dict.fromkeys((config.data.eval_split, *named, "train")))
    if split is not None and named and split not in allowed:
        raise CommandError(f"unknown split {split!r}: choose one of {', '.join(allowed)}")
    if split is not None:
        config.data.eval_split = split  # a locked config still takes new values for its keys

    from tfjax.runs import trainer

    try:
        return trainer.restore(config, workdir, step, average_last=average_last)
    except ValueError as err:
        raise CommandError(str(err)) from err
    except FileNotFoundError as err:
        raise CommandError(
            f"{pathlib.Path(workdir) / 'checkpoints'} holds no checkpoint: "
            + _train_hint(pathlib.Path(workdir), config.model.kind)
        ) from err


def check_max_length(run: Any, max_length: int) -> None:
    """Raises CommandError unless the model of `run` can decode `max_length` positions."""
    from tfjax.inference import decoding

    try:
        decoding.check_lengths(run.model, max_length)
    except ValueError as err:
        raise CommandError(f"--max_length={max_length}: {err}") from err


def _check_options(beam_size: int, alpha: float, max_examples: int, batch_size: int) -> None:
    if beam_size < 1:
        raise CommandError(f"--beam_size must be >= 1 (1 = greedy), got {beam_size}")
    if alpha < 0:
        raise CommandError(f"--alpha must be >= 0, got {alpha}")
    if max_examples < 0:
        raise CommandError(f"--max_examples must be >= 0 (0 = all), got {max_examples}")
    if batch_size < 1:
        raise CommandError(f"--batch_size must be >= 1, got {batch_size}")


def _decoded_scores(run, params, name: str, workdir: pathlib.Path, **options) -> dict[str, Any]:
    """Decodes the split, writes the hypotheses file and scores it (BLEU, chrF, exact match)."""
    from tfjax.inference import evaluation

    hypotheses, references, _ = evaluation.decode_dataset(run, params, **options)
    path = workdir / "eval" / f"{name}.hyp.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in hypotheses), encoding="utf-8")
    return {
        "num_examples": len(hypotheses),
        "bleu": evaluation.bleu(hypotheses, references),
        "chrf": evaluation.chrf(hypotheses, references),
        "exact_match": evaluation.exact_match(hypotheses, references),
        "bleu_signature": evaluation.bleu_signature(),
        "chrf_signature": evaluation.chrf_signature(),
        "hypotheses": str(path.relative_to(workdir)),
    }


def evaluate_workdir(
    workdir: str | pathlib.Path,
    *,
    split: str | None = None,
    beam_size: int = 4,
    alpha: float = 0.6,
    step: int | None = None,
    max_examples: int = 0,
    batch_size: int = 64,
    average_last: int = 1,
    sample_windows: int = 2400,
) -> dict[str, Any]:
    """Evaluates the run in `workdir` as the module docstring describes; returns the record.

    Raises:
        CommandError: for invalid options, or a workdir without a trained run.
    """
    _check_options(beam_size, alpha, max_examples, batch_size)
    workdir = pathlib.Path(workdir)
    if average_last < 1:
        raise CommandError(f"--average_last must be >= 1 (1 = no averaging), got {average_last}")
    run, restored = restore_workdir(
        workdir,
        tool="experiments.evaluate",
        kinds=tuple(TOOLS),
        step=step,
        split=split,
        average_last=average_last,
    )
    from tfjax.runs import trainer

    params, split = restored.state.params, run.config.data.eval_split
    scores = trainer.evaluate(run, params, max_examples=max_examples)
    count = min(max_examples or len(run.examples.eval), len(run.examples.eval))
    record = {"split": split, "step": restored.step, "num_examples": count}
    name = f"{split}_step{restored.step}"
    if average_last > 1:
        record["averaged_checkpoints"] = average_last
        name += f"_avg{average_last}"
    if run.examples.format == "seq2seq":
        name += f"_beam{beam_size}"
        scores["teacher_forced_exact_match"] = scores.pop("exact_match")
        record.update(beam_size=beam_size, alpha=alpha)
        options = dict(beam_size=beam_size, alpha=alpha, max_examples=max_examples)
        record.update(_decoded_scores(run, params, name, workdir, batch_size=batch_size, **options))
    stream = run.examples.eval_stream
    if stream is not None and sample_windows:
        from tfjax.data import datasets

        length = run.config.data.max_target_len
        windows = datasets.sample_windows(stream, length, sample_windows, seed=0)
        sampled = trainer.evaluate(run, params, examples=windows)
        record.update(sampled_windows=sample_windows, sampled_nll=sampled["nll"])
    record.update(scores)
    text = json.dumps(record, indent=2) + "\n"
    (workdir / "eval").mkdir(exist_ok=True)
    (workdir / "eval" / f"{name}.json").write_text(text, encoding="utf-8")
    (workdir / EVAL_FILE).write_text(text, encoding="utf-8")
    return record


def _report(record: dict[str, Any]) -> str:
    """The printed summary: where, then the scores, then the sacreBLEU signatures."""
    head = f"{record['split']} split, step {record['step']}, {record['num_examples']} examples"
    if "beam_size" in record:
        head += f", beam {record['beam_size']} (alpha {record['alpha']})"
    numbers = {k: v for k, v in record.items() if isinstance(v, float) and k != "alpha"}
    lines = [head, "  ".join(f"{k} {v:.4f}" for k, v in numbers.items())]
    lines += [
        f"{k}: {record[k]}"
        for k in ("bleu_signature", "chrf_signature", "hypotheses")
        if k in record
    ]
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it reads at INFO
    logging.getLogger("tfjax").setLevel(logging.INFO)
    try:
        record = evaluate_workdir(
            FLAGS.workdir,
            split=FLAGS.split,
            beam_size=FLAGS.beam_size,
            alpha=FLAGS.alpha,
            step=FLAGS.step,
            max_examples=FLAGS.max_examples,
            batch_size=FLAGS.batch_size,
            average_last=FLAGS.average_last,
            sample_windows=FLAGS.sample_windows,
        )
    except CommandError as err:
        sys.exit(f"error: {err}")
    print(_report(record))
    print(f"written: {pathlib.Path(FLAGS.workdir) / EVAL_FILE}")


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
    flags.DEFINE_string("split", None, "Split to evaluate: the run's data.eval_split or train.")
    flags.DEFINE_integer("beam_size", 4, "Beam size for seq2seq runs (1 = greedy).")
    flags.DEFINE_float("alpha", 0.6, "Beam search length penalty exponent.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.DEFINE_integer("max_examples", 0, "Evaluate the first N examples only (0 = all).")
    flags.DEFINE_integer("batch_size", 64, "Sources decoded per call.")
    flags.DEFINE_integer(
        "average_last", 1, "Average the parameters of the last N checkpoints (1 = none)."
    )
    flags.DEFINE_integer(
        "sample_windows",
        2400,
        "Text-stream LMs: also report the loss on N random windows (nanoGPT: 200 x 12).",
    )
    flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
