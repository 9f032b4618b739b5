"""Translate lines with a trained seq2seq run: `python -m experiments.translate --workdir=W`.

Flags: `--input` (a text file, one source per line; default: stdin), `--beam_size` (4; 1 =
greedy), `--alpha` (0.6), `--max_length` (target positions, EOS included; default: the run's
`data.max_target_len`), `--step` (default: the latest good checkpoint), `--batch_size` (64).

Prints one output line per input line, in order, on stdout; warnings go to stderr:
  * a line with more words than the model reads (its `data.max_source_len`, EOS included, so
    max_source_len - 1 words) is truncated to its first words, with a warning naming the line
    number. Truncating keeps a long stream going and is what the model can see; the alternative,
    refusing the whole input, would lose every other line over one long one;
  * an empty (or blank) line gives an empty output line and a warning;
  * words outside the tokenizer's vocabulary read as <unk>; the first line that has some is
    reported once.
A workdir without a trained run, or with a model that is not an encoder-decoder, stops with an
error saying what to run instead (`experiments.train`, or `experiments.generate` for decoder-only
language models). Runs on CPU; needs no network.
"""

import logging
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from absl import logging as absl_logging

from experiments import evaluate

FLAGS = flags.FLAGS
TOOL = "experiments.translate"


def encode_lines(
    lines: Sequence[str], tokenizer: Any, max_source_len: int
) -> tuple[list[list[int] | None], list[str]]:
    """Token ids of each line (EOS appended, truncated to fit), None for blank lines.

    Args:
        lines: source texts, whitespace-separated words.
        tokenizer: the run's `WordTokenizer`.
        max_source_len: the longest source the model takes, EOS included.

    Returns:
        (ids per line or None, warnings naming 1-based line numbers).
    """
    from tfjax.data import tokenizers

    encoded, warnings, unknown_reported = [], [], False
    for number, line in enumerate(lines, start=1):
        words = line.split()
        if not words:
            warnings.append(f"line {number} is empty: its output line is empty too")
            encoded.append(None)
            continue
        ids = tokenizer.encode(line)
        unknown = sorted({w for w, i in zip(words, ids, strict=True) if i == tokenizers.UNK_ID})
        if unknown and not unknown_reported:
            unknown_reported = True
            warnings.append(
                f"line {number}: {', '.join(unknown)} not in the model's vocabulary, read as "
                "<unk> (reported for the first such line only)"
            )
        if len(ids) >= max_source_len:
            warnings.append(
                f"line {number} has {len(ids)} words, but the model reads at most "
                f"{max_source_len - 1} (data.max_source_len={max_source_len} with EOS): "
                f"truncated to its first {max_source_len - 1} words"
            )
            ids = ids[: max_source_len - 1]
        encoded.append([*ids, tokenizers.EOS_ID])
    return encoded, warnings


def translate_lines(
    run: Any,
    params: Any,
    lines: Sequence[str],
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_length: int | None = None,
    batch_size: int = 64,
) -> tuple[list[str], list[str]]:
    """Translates each line with the seq2seq `run`; blank lines give "".

    Returns:
        (one output per line, warnings as in `encode_lines`).

    Raises:
        CommandError: for a max_length outside [1, the model's max_len].
    """
    from tfjax.inference import evaluation

    length = max_length or run.config.data.max_target_len
    evaluate.check_max_length(run, length)
    encoded, warnings = encode_lines(lines, run.examples.tokenizer, run.config.data.max_source_len)
    sources = [ids for ids in encoded if ids is not None]
    decoded = iter(
        evaluation.decode_sources(
            run,
            params,
            sources,
            beam_size=beam_size,
            alpha=alpha,
            max_length=length,
            batch_size=batch_size,
        )
    )
    return ["" if ids is None else next(decoded) for ids in encoded], warnings


def _read_lines(path: str | None) -> list[str]:
    if path is None:
        return sys.stdin.read().splitlines()
    file = pathlib.Path(path)
    if not file.is_file():
        raise evaluate.CommandError(f"--input={path}: no such file")
    return file.read_text(encoding="utf-8").splitlines()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it reads at INFO
    logging.getLogger("tfjax").setLevel(logging.INFO)
    try:
        if FLAGS.beam_size < 1 or FLAGS.batch_size < 1:
            raise evaluate.CommandError("--beam_size and --batch_size must be >= 1")
        evaluate.load_workdir_config(FLAGS.workdir, tool=TOOL, kinds=("encoder_decoder",))
        lines = _read_lines(FLAGS.input)  # before the slow restore: fail fast on a bad path
        run, restored = evaluate.restore_workdir(
            FLAGS.workdir, tool=TOOL, kinds=("encoder_decoder",), step=FLAGS.step
        )
        outputs, warnings = translate_lines(
            run,
            restored.state.params,
            lines,
            beam_size=FLAGS.beam_size,
            alpha=FLAGS.alpha,
            max_length=FLAGS.max_length,
            batch_size=FLAGS.batch_size,
        )
    except evaluate.CommandError as err:
        sys.exit(f"error: {err}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write("".join(f"{line}\n" for line in outputs))


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory of an encoder-decoder model.")
    flags.DEFINE_string("input", None, "Text file with one source per line (default: stdin).")
    flags.DEFINE_integer("beam_size", 4, "Beam size (1 = greedy).")
    flags.DEFINE_float("alpha", 0.6, "Beam search length penalty exponent.")
    flags.DEFINE_integer("max_length", None, "Target positions (default: data.max_target_len).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.DEFINE_integer("batch_size", 64, "Sources decoded per call.")
    flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
