"""Evaluate a trained run: `python -m experiments.evaluate --workdir=W [--beam_size=4]`.

Flags: `--split` (default: the run's `data.eval_split`; any split of the run's dataset, e.g.
"test2016" for multi30k, or "train"), `--average_last` (1; N > 1 averages the parameters of the
last N checkpoints), `--beam_size` (4; 1 = greedy), `--alpha` (0.6, beam length penalty; a
workdir converted from a checkpoint with its own decoding, e.g. Marian's, defaults to that),
`--step` (default: the latest good checkpoint), `--max_examples` (0 = the whole split),
`--batch_size` (64), `--source_file` with `--reference_file` (seq2seq runs: score any
line-aligned text files instead of a split of the run's dataset), `--oracle_length` (seq2seq,
with `--beam_size=1`: greedy decoding that ends each hypothesis where its reference ends, an
analysis aid for length generalisation, e.g. SCAN's length split; the record says so).

Reads `W/config.json`, restores the checkpoint, then
  * seq2seq runs: decodes the split and scores the detokenized hypotheses against the targets:
    sacreBLEU BLEU (13a tokenizer, cased) and chrF2, both 0-100, and exact match (0-1); adds the
    teacher-forced `loss`, `nll`, `perplexity`, `accuracy` (per token),
    `teacher_forced_exact_match` and `greedy_exact_match` of `tfjax.runs.evaluator.evaluate`.
    Hypotheses go to `W/eval/<split>_step<N>_beam<k>[_alpha<a>].hyp.txt` (alpha: beam search),
    one line per example, in order.
  * lm and classify runs: the teacher-forced metrics of `tfjax.runs.evaluator.evaluate` (the
    same keys as the `eval` records of `metrics.jsonl`); language models on a text stream (e.g.
    tinyshakespeare) score the whole split in consecutive windows and also report
    `sampled_nll`, the mean loss over `--sample_windows` (2,400 = nanoGPT's 200 batches of 12)
    windows at random offsets, seed 0.
  * with `--source_file=S --reference_file=R` (seq2seq runs): each line of S is translated as
    `experiments.translate` would and scored against the same line of R as written: BLEU, chrF
    and exact match (`tfjax.runs.evaluator.evaluate_files`); hypotheses go to
    `W/eval/files_<S stem>_step<N>_beam<k>[_alpha<a>].hyp.txt`.
The scores are printed and written to `W/eval.json` (the latest evaluation: split, step,
beam_size, alpha, num_examples, the scores and the sacreBLEU signatures); a copy stays in
`W/eval/<split>_step<N>_beam<k>[_alpha<a>].json`, so evaluations with several length
penalties (choosing alpha on val) keep one record each. Runs on one host, CPU included.

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
