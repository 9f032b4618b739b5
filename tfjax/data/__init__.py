"""Data for tfjax: embedded datasets, local corpora and files, tokenizers and the grain pipeline.

Submodules:
  * `datasets`: the `data` config group → tokenized train and eval examples, one path for
    every source.
  * `registry`: the data sources by name (`data.name`), with their formats and splits;
    `register` adds one.
  * `catalog`: the built-in sources, registered by name: the generators below, the local
    corpora, your own files and the hub.
  * `scan`: SCAN (Lake & Baroni 2018) generated from its grammar, with the standard splits.
  * `tasks`: algorithmic tasks (copy, reverse, sort, parity, majority) from a seed.
  * `listops`: ListOps as generated for the Long Range Arena, from a seed.
  * `sources`: text files, TSV, the named corpora (Multi30k, Tiny Shakespeare) in the data
    directory and Hugging Face hub datasets, with errors that name the file and line.
  * `corpora`: the named corpora's origins, licenses, citations and shipped SHA-256 sums.
  * `fetch`: a named corpus into the data directory, downloaded or from the user's files.
  * `tokenizers`: word, character and SentencePiece tokenizers and the special ids (PAD 0,
    BOS 1, EOS 2, UNK 3).
  * `pipeline`: encoding to padded int32 examples, grain datasets and resumable iterators;
    `packing` puts several examples in one row.
  * `pretrained_tokenizer`: a Hugging Face checkpoint's tokenizer behind the same interface.
  * `workdir_tokenizer`: a workdir's tokenizer file read back, damage named in one line.

Submodules load on first attribute access (`tfjax.data.scan`) or explicit import (`from
tfjax.data import scan`): `scan`, `tasks` and `tokenizers` need only numpy, while `pipeline`
imports grain, which itself imports jax, so it is only paid for when batches are wanted.
"""

from tfjax import _lazy

_SUBMODULES = (
    "catalog",
    "corpora",
    "datasets",
    "fetch",
    "listops",
    "packing",
    "pipeline",
    "pretrained_tokenizer",
    "registry",
    "scan",
    "sources",
    "tasks",
    "tokenizers",
    "workdir_tokenizer",
)

__all__ = list(_SUBMODULES)
__getattr__, __dir__ = _lazy.submodules(__name__, _SUBMODULES)
