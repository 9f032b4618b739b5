"""Evaluate a trained run: `python -m experiments.evaluate --workdir=W [--beam_size=4]`.

Restores `W`'s checkpoint (the latest good one, or `--step`; `--average_last=N` averages the
parameters of the last N) and scores a split of the run's dataset (`--split`, default the run's
`data.eval_split`) or, for seq2seq runs, line-aligned `--source_file` and `--reference_file`.
Seq2seq runs are decoded (beam search; `--beam_size=1` is greedy) and scored with sacreBLEU BLEU,
chrF and exact match beside the teacher-forced metrics; language models and classifiers get the
teacher-forced metrics (on a text stream also `sampled_nll`, nanoGPT's estimate over random
windows). The scores are printed and written to `W/eval.json`, with a copy and the hypotheses
under `W/eval/`. Runs on one host, CPU included. Every flag: `--help`; the outputs in full:
docs/decoding.md, "What `experiments.evaluate` writes".

The work is done by `tfjax.runs.evaluator.evaluate_workdir`; this module defines its flags only
when run as a script.
"""

import pathlib
import sys

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS


def _evaluate() -> None:
    from tfjax.runs import evaluator

    options = dict(
        beam_size=FLAGS.beam_size,
        alpha=FLAGS.alpha,
        step=FLAGS.step,
        max_examples=FLAGS.max_examples,
        batch_size=FLAGS.batch_size,
        average_last=FLAGS.average_last,
    )
    files = (FLAGS.source_file, FLAGS.reference_file)
    if any(files):
        if not all(files):
            raise cli.UsageError(
                "--source_file and --reference_file come together: a model's inputs and the "
                "lines its outputs are scored against"
            )
        if FLAGS.split is not None:
            raise cli.UsageError("--split scores a split of the run's dataset; drop it with files")
        if FLAGS.oracle_length:
            raise cli.UsageError("--oracle_length needs the run's own split, not --source_file")
        record = evaluator.evaluate_files(FLAGS.workdir, *files, **options)
    else:
        record = evaluator.evaluate_workdir(
            FLAGS.workdir,
            split=FLAGS.split,
            sample_windows=FLAGS.sample_windows,
            oracle_length=FLAGS.oracle_length,
            **options,
        )
    for warning in record.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(evaluator.report(record))
    print(f"written: {pathlib.Path(FLAGS.workdir) / evaluator.EVAL_FILE}")


def main(argv):
    cli.no_arguments(argv)
    cli.quiet_logs()
    _evaluate()


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory written by experiments.train.")
    flags.DEFINE_string("split", None, "Split to evaluate: the run's data.eval_split or train.")
    flags.DEFINE_string("source_file", None, "Seq2seq: score on these source lines instead...")
    flags.DEFINE_string("reference_file", None, "...against these references (line-aligned).")
    flags.DEFINE_integer(
        "beam_size", None, "Seq2seq beam size (1 = greedy; default 4, or a converted model's)."
    )
    flags.DEFINE_float(
        "alpha", None, "Length penalty exponent (default 0.6, or a converted checkpoint's)."
    )
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
    flags.DEFINE_boolean(
        "oracle_length",
        False,
        "Seq2seq, greedy: end each hypothesis where its reference ends (an analysis aid).",
    )
    flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
