"""Continue prompts with a decoder-only LM: `python -m experiments.generate --workdir=W --prompt=P`.

Flags: `--prompt` (repeatable: all prompts, of any lengths, decode in one batch),
`--max_length` (the whole sequence, prompt plus continuation including EOS; default: the run's
`data.max_target_len`, the trained length; past it each token is predicted from BOS and the
last `data.max_target_len - 1` tokens, recomputed without a cache, as nanoGPT samples past its
block size), `--temperature` (0 = greedy), `--top_k` (0 = off), `--top_p` (1 = off),
`--seed` (0; the sampling key), `--step` (default: the latest good checkpoint).

Prints one continuation per prompt, in order, on stdout: the text generated after the prompt,
up to EOS. For the `configs/lm.py` runs a prompt is a source followed by the separator, e.g.
`--prompt="s3 s1 s7 |"`, and the continuation is the model's answer ("s7 s1 s3"). Prompt words
outside the vocabulary read as <unk>, with a warning on stderr. A workdir without a trained run,
or with a model that is not decoder-only, stops with an error saying what to run instead. The
work is done by `tfjax.runs.trained.Generator`.
"""

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
TOOL = "experiments.generate"


def _generate() -> None:
    from tfjax.models import kinds
    from tfjax.runs import trained

    options = dict(temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p)
    trained.check_sampling(**options)  # before the slow restore
    trained.check_max_length(FLAGS.max_length)
    generators = kinds.names(facade="generator")  # the decoder-only language models
    generator = trained.load(FLAGS.workdir, kinds=generators, tool=TOOL, step=FLAGS.step)
    outputs = generator.generate(
        FLAGS.prompt or [], max_length=FLAGS.max_length, seed=FLAGS.seed, **options
    )
    cli.print_lines(*outputs)


def main(argv):
    cli.no_arguments(argv)
    cli.quiet_logs()
    _generate()


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory of a decoder-only model.")
    flags.DEFINE_multi_string("prompt", None, "A prompt to continue (repeatable).")
    flags.DEFINE_integer("max_length", None, "Prompt + continuation length (default: data).")
    flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0 = greedy).")
    flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest tokens (0 = all).")
    flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
    flags.DEFINE_integer("seed", 0, "Seed of the sampling key.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.mark_flags_as_required(["workdir", "prompt"])


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
