"""Get a named corpus: `python -m experiments.data --corpus=tinyshakespeare`.

Puts the corpus into the data directory (`--data_dir`, by default the one training reads:
$TFJAX_DATA_DIR, else ~/.cache/tfjax/data), downloaded from its upstream repository at a pinned
commit, or with `--from=PATH` laid out from files you already have: a copy of Tiny Shakespeare's
input.txt, or a folder with the Multi30k files (upstream names or the data directory's, gzipped
or not). Every file is checked against the SHA-256 sum tfjax ships before it is installed; a file
already in place and verified is not downloaded again. `--list` lists the corpora, where each
comes from and whether the data directory holds it verified. docs/data.md has the layout,
licenses and citations. Bad input, a wrong sum or no network end in one `error:` line and
status 2.

The work is done by `tfjax.data.fetch`; this module defines its flags only when run as a script.
"""

import pathlib

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS


def listing(root: pathlib.Path) -> list[str]:
    """The lines of `--list`: the data directory, then per corpus its name, its status in
    `root` (verified, missing, incomplete, corrupt), what it is, where it comes from and its
    license."""
    from tfjax.data import corpora

    lines = [f"data directory: {root}"]
    for corpus in corpora.CORPORA.values():
        lines.append(f"{corpus.name:<16} {corpora.status(root, corpus.name):<10} {corpus.title}")
        count = f"{len(corpus.files)} file{'s' if len(corpus.files) > 1 else ''}"
        source = f"https://github.com/{corpus.repository} at commit {corpus.commit[:12]}"
        lines.append(f"{'':<27} {count} from {source}")
        lines.append(f"{'':<27} license: {corpus.license}")
    return lines


def get_corpus(name: str, root: pathlib.Path, source: str | None, base_url: str) -> list[str]:
    """Puts corpus `name` into `root` (from `source` if given, else downloaded from
    `base_url`); returns the lines that report it."""
    from tfjax.data import corpora, fetch

    corpus = corpora.get(name)  # an unknown name fails before anything is read
    if source:
        done = fetch.lay_out(name, source, root)
    else:
        done = fetch.download(name, root, base_url=base_url)
    lines = [
        f"{item.action}: {item.name}" + (f" (from {item.origin})" if item.action != "kept" else "")
        for item in done
    ]
    lines.append(f"{name}: {len(done)} file{'s' if len(done) > 1 else ''} verified in {root}")
    lines.append(f"cite: {corpus.citation}; license: {corpus.license}")
    return lines


def main(argv):
    cli.no_arguments(argv)
    from tfjax.data import sources

    root = sources.data_dir(FLAGS.data_dir or "")
    source = FLAGS["from"].value
    if FLAGS.list:
        if FLAGS.corpus or source:
            raise cli.UsageError("--list lists every corpus: drop --corpus and --from")
        print("\n".join(listing(root)))
        return
    if not FLAGS.corpus:
        raise cli.UsageError("give --corpus=NAME (--list names the corpora)")
    print("\n".join(get_corpus(FLAGS.corpus, root, source, FLAGS.base_url)))


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    from tfjax.data import corpora

    flags.DEFINE_string("corpus", None, f"The corpus to get: {', '.join(corpora.CORPORA)}.")
    flags.DEFINE_string(
        "from",
        None,
        "Lay the corpus out from these files instead of downloading it: Tiny Shakespeare's "
        "input.txt, or a folder holding the Multi30k files (docs/data.md).",
    )
    flags.DEFINE_string(
        "data_dir",
        None,
        "The data directory (default: $TFJAX_DATA_DIR, else $XDG_CACHE_HOME/tfjax/data, else "
        "~/.cache/tfjax/data; the default of data.dir).",
    )
    flags.DEFINE_bool("list", False, "List the corpora and whether the data directory has them.")
    flags.DEFINE_string(
        "base_url",
        corpora.GITHUB_RAW,
        "Where the pinned upstream files are read from, as <base_url>/<owner>/<repo>/<commit>/"
        "<path>: a mirror with GitHub's raw layout, or a file:// folder.",
    )


if __name__ == "__main__":
    _define_flags()
    cli.main(main, compilation_cache=False)
