"""Translate lines with a trained seq2seq run: `python -m experiments.translate --workdir=W`.

Flags: `--input` (a text file, one source per line; default: stdin), `--beam_size` (4; 1 =
greedy), `--alpha` (0.6), `--max_length` (target positions, EOS included; default: the run's
`data.max_target_len`), `--step` (default: the latest good checkpoint), `--batch_size` (64).
A workdir converted from a checkpoint with its own decoding (Marian's generation_config.json)
defaults to that: its beam size, length penalty and max_length.

Prints one output line per input line, in order, on stdout; warnings go to stderr: a line
longer than the model reads (`data.max_source_len` tokens with EOS) is truncated, with a warning
naming the line (refusing the whole input would lose every other line over one long one); an
empty line gives an empty output line; words outside the vocabulary read as <unk>, reported for
the first such line; when most translations come out empty, a warning gives their count.
Input that is not UTF-8 stops with its line, column and byte (`<stdin>:2: byte 0xc3 at column
1 is not UTF-8; ...`). Works for every tokenizer kind (word, char, SentencePiece). A workdir
without a trained run, or with a model that is not an encoder-decoder, stops with an error
saying what to run instead. The work is done by `tfjax.runs.trained.Translator`.
"""

import sys

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
TOOL = "experiments.translate"


def _read_lines(path: str | None) -> list[str]:
    """The lines of `path`, or of stdin; bytes that are not UTF-8 stop with their line."""
    from tfjax.data import sources
    from tfjax.runs import trained

    if path is None:
        return sources.decode_utf8(sys.stdin.buffer.read(), "<stdin>").splitlines()
    return trained.read_lines(path, "--input")


def _translate() -> None:
    from tfjax.models import kinds
    from tfjax.runs import trained

    translators = kinds.names(facade="translator")  # the encoder-decoders
    trained.check_max_length(FLAGS.max_length)
    trained.load_config(FLAGS.workdir, kinds=translators, tool=TOOL)  # fail fast
    lines = _read_lines(FLAGS.input)  # before the slow restore: fail fast on a bad path
    translator = trained.load(FLAGS.workdir, kinds=translators, tool=TOOL, step=FLAGS.step)
    options = dict(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, batch_size=FLAGS.batch_size)
    cli.print_lines(*translator.translate(lines, max_length=FLAGS.max_length, **options))


def main(argv):
    cli.no_arguments(argv)
    cli.quiet_logs()
    _translate()


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory of an encoder-decoder model.")
    flags.DEFINE_string("input", None, "Text file with one source per line (default: stdin).")
    flags.DEFINE_integer(
        "beam_size", None, "Beam size (1 = greedy; default 4, or a converted checkpoint's)."
    )
    flags.DEFINE_float(
        "alpha", None, "Length penalty exponent (default 0.6, or a converted checkpoint's)."
    )
    flags.DEFINE_integer("max_length", None, "Target positions (default: data.max_target_len).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.DEFINE_integer("batch_size", 64, "Sources decoded per call.")
    flags.mark_flag_as_required("workdir")


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
