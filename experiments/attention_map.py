"""Draw what a trained model attends to: `python -m experiments.attention_map --workdir=W --text=T`.

For an encoder-decoder run the text is translated (greedy, or `--beam_size`) and the maps are
those of that translation: cross-attention with the output tokens as rows and the source
tokens as columns, the decoder's and the encoder's self-attention. A decoder-only run reads the
text as a prompt, an encoder-only run as its input. One PNG per attention layer, each with one
panel per head (`tfjax.viz.attention_heads`), goes to `--out` (default `WORKDIR/attention`),
named after the layer (`decoder_layer_0_cross_attention.png`); `--layers=cross` or `self`
keeps one kind. Prints the translation (or the text) and then each path written.

`--stats` draws nothing and needs no text: it prints, for every attention layer, the mean
entropy (nats), largest weight and logit standard deviation of its rows over the eval split
(`--num_examples` of them; all by default), teacher-forced: how peaked the attention is and
how far apart its scores are (`tfjax.inference.attention_maps.statistics`):
    python -m experiments.attention_map --workdir=W --stats

Needs matplotlib (`pip install "tfjax[viz]"`). The weights come from
`tfjax.runs.trained.Trained.attention`: captured from the model's own forward pass
(`tfjax.inference.attention_maps`), for every attention implementation.
"""

import importlib.util
import pathlib

from absl import flags

from experiments import cli
from tfjax import errors

FLAGS = flags.FLAGS
TOOL = "experiments.attention_map"
LAYERS = {"all": None, "cross": "cross_attention", "self": "self_attention"}


def file_name(layer: str) -> str:
    """ "decoder/layer_0/cross_attention" -> "decoder_layer_0_cross_attention.png"."""
    return layer.replace("/", "_").replace("#", "_call") + ".png"


def draw(maps, directory: pathlib.Path, *, layers: str = "all", title: str = "") -> list:
    """Writes one PNG per layer of `maps` (`attention_maps.Maps`); returns the paths."""
    from tfjax import viz

    kind = LAYERS[layers]
    names = list(maps.weights) if kind is None else maps.layers(kind)
    paths = []
    for name in names:
        figure = viz.attention_heads(
            maps.weights[name],
            query_tokens=maps.queries[name],
            key_tokens=maps.keys[name],
            title=f"{name}: {title}" if title else name,
        )
        paths.append(viz.save(figure, directory / file_name(name)))
    return paths


def stats_lines(statistics: dict) -> list[str]:
    """A table of `Trained.attention_statistics`, one line per layer, aligned."""
    width = max(len("layer"), *(len(name) for name in statistics))
    lines = [f"{'layer':<{width}}  entropy  max_weight  logit_std    rows"]
    for name, row in statistics.items():
        lines.append(
            f"{name:<{width}}  {row['entropy']:7.3f}  {row['max_weight']:10.3f}"
            f"  {row['logit_std']:9.3f}  {row['rows']:6d}"
        )
    return lines


def _stats() -> None:
    from tfjax.runs import trained

    if FLAGS.num_examples is not None and FLAGS.num_examples < 1:
        raise cli.UsageError(f"--num_examples={FLAGS.num_examples}: give at least 1")
    restored = trained.load(FLAGS.workdir, tool=TOOL, step=FLAGS.step)
    statistics = restored.attention_statistics(FLAGS.num_examples)
    count = len(restored.run.examples.eval[: FLAGS.num_examples])
    title = f"attention over {count} eval examples, step {restored.step}"
    cli.print_lines([title, *stats_lines(statistics)], [])


def _attention_map() -> None:
    from tfjax.runs import trained

    if FLAGS.stats:
        return _stats()
    if not (FLAGS.text or "").split():
        raise cli.UsageError("--text is empty: give a sentence to look at (or --stats)")
    if FLAGS.layers not in LAYERS:
        raise cli.UsageError(f"--layers={FLAGS.layers}: choose one of {', '.join(LAYERS)}")
    if importlib.util.find_spec("matplotlib") is None:  # before the slow restore
        raise errors.DependencyError(
            "drawing attention maps needs matplotlib, which is not installed: "
            'pip install "tfjax[viz]"'
        )
    out = pathlib.Path(FLAGS.out) if FLAGS.out else pathlib.Path(FLAGS.workdir) / "attention"
    if pathlib.Path(FLAGS.workdir).is_dir():  # a read-only --out stops before the restore
        from tfjax.training import storage

        storage.check_writable(out, f"--out {out}", "pass --out=<a writable directory>")
    restored = trained.load(FLAGS.workdir, tool=TOOL, step=FLAGS.step)
    maps, text = restored.attention(FLAGS.text, beam_size=FLAGS.beam_size)
    paths = draw(maps, out, layers=FLAGS.layers, title=text)
    cli.print_lines([text, *map(str, paths)], [])


def main(argv):
    cli.no_arguments(argv)
    cli.quiet_logs()
    _attention_map()


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("workdir", None, "Run directory of a trained model (any kind).")
    flags.DEFINE_string("text", None, "A sentence: translated, continued or classified.")
    flags.DEFINE_string("out", None, "Where the PNGs go (default: WORKDIR/attention).")
    flags.DEFINE_string("layers", "all", "all, cross or self: which attention layers to draw.")
    flags.DEFINE_integer("beam_size", 1, "Beam size of the translation (1 = greedy).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest good one).")
    flags.DEFINE_bool("stats", False, "Print each layer's attention statistics; draw nothing.")
    flags.DEFINE_integer("num_examples", None, "--stats: eval examples to use (default: all).")
    flags.mark_flags_as_required(["workdir"])


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
