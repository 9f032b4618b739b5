"""The registry of data sources: `data.name` → a function returning the raw examples of a split.

A source is one corpus, generator or file reader. It registers under a name, together with what
the encoding path of `tfjax.data.datasets` needs to know about it:
  * its reader, `read(request) -> raw examples` of `request.split`: a list of (source, target)
    string pairs, a list of (text, label) pairs with integer labels >= 0, or one string (a text
    stream, cut into windows for language models);
  * `formats`: the example formats it feeds, i.e. the models that train on it: "seq2seq"
    (encoder_decoder), "lm" (decoder_only) and "classify" (encoder_only). `PAIRS`,
    `CLASSIFICATION` and `TEXT` name the usual sets;
  * `splits`: the names `data.eval_split` may take ("train" among them; empty = any name, as for
    hub datasets, whose splits only the hub knows);
  * `seeded`: generated from the run's seed rather than read from files;
  * `check(config)`: optional validation of the `data` config, run when `DataConfig` is built
    (e.g. "files" needs `data.train_path`);
  * `streams(config)`: for a source of text and pairs alike, whether its "lm" training split is
    a text stream for this config (known without reading it: "files" looks at the path); by
    default, sources of `TEXT` alone stream.

The built-in sources live in `tfjax.data.catalog` and are registered on the first call to this
module. A new source registers from any module imported before its config is built (an example:
docs/data.md, "Adding a corpus").
"""

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from tfjax import errors

FORMATS = ("seq2seq", "lm", "classify")
PAIRS = ("seq2seq", "lm")  # (source, target) pairs: translation, or "source | target" for an LM
CLASSIFICATION = ("classify",)  # (text, label) pairs
TEXT = ("lm",)  # one string: a text stream for language models
BUILTINS = "tfjax.data.catalog"  # the module that registers the built-in sources


@dataclasses.dataclass(frozen=True)
class Request:
    """What a reader is asked for.

    Attributes:
      config: the `data` config (`tfjax.data.datasets.DataConfig`).
      split: the split to read: "train" or `config.eval_split`.
      seed: the run's seed (generated sources derive their examples from it).
      format: the example format the model trains on: "seq2seq", "lm" or "classify".
    """

    config: Any
    split: str
    seed: int
    format: str


@dataclasses.dataclass(frozen=True)
class Source:
    """A registered source; `register` builds it.

    Attributes:
      name: the `data.name` that selects it.
      read: `read(request)` → the raw examples of `request.split` (see the module docstring).
      formats: the example formats it feeds, a non-empty subset of `FORMATS`.
      splits: the names `data.eval_split` may take, "train" included; empty for any name.
      seeded: whether its examples are generated from the run's seed.
      check: `check(config)` raises ValueError for `data` settings it cannot read, or None.
      streams: `streams(config)`: whether the "lm" training split is one string (a text
        stream), or None: exactly when `formats` is `TEXT`.
    """

    name: str
    read: Callable[[Request], Any]
    formats: tuple[str, ...]
    splits: tuple[str, ...]
    seeded: bool = False
    check: Callable[[Any], None] | None = None
    streams: Callable[[Any], bool] | None = None

    def text_stream(self, config) -> bool:
        """Whether the "lm" training split of `config` is a text stream (`streams`)."""
        return self.formats == TEXT if self.streams is None else self.streams(config)

    def __post_init__(self):
        unknown = [f for f in self.formats if f not in FORMATS]
        if not self.formats or unknown:
            raise ValueError(
                f"source {self.name!r}: formats={self.formats!r} must be a non-empty subset of "
                f"{FORMATS}"
            )
        if self.splits and "train" not in self.splits:
            raise ValueError(
                f"source {self.name!r}: splits={self.splits!r} must include 'train' (or be "
                "empty for any split name)"
            )


_SOURCES: dict[str, Source] = {}  # by name, in registration order
_builtins_loaded = False


def _load_builtins() -> None:
    """Imports `BUILTINS` once; its `register` calls come back here and find the flag set."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module(BUILTINS)


def register(
    name: str,
    *,
    formats: Sequence[str],
    splits: Sequence[str],
    seeded: bool = False,
    check: Callable[[Any], None] | None = None,
    streams: Callable[[Any], bool] | None = None,
) -> Callable:
    """A decorator that registers its function as the reader of source `name`.

    Args:
      name: the `data.name` that selects the source.
      formats: the example formats it feeds ("seq2seq", "lm", "classify").
      splits: the split names `data.eval_split` may take, "train" included; empty for any.
      seeded: whether the examples are generated from the run's seed.
      check: called with the `data` config when it is built; raises ValueError for settings
        the source cannot read.
      streams: for a source of "lm" pairs and text alike, whether `config`'s "lm" training
        split is a text stream (default: only `TEXT` sources stream).

    Returns:
      A decorator that registers `read(request)` and returns it unchanged.

    Raises:
      ValueError: if `name` is taken, or for invalid formats or splits.
    """

    def decorator(read: Callable[[Request], Any]) -> Callable[[Request], Any]:
        _load_builtins()
        source = Source(name, read, tuple(formats), tuple(splits), seeded, check, streams)
        if name in _SOURCES:
            taken = _SOURCES[name].read
            raise ValueError(
                f"data source {name!r} is already registered (by {taken.__module__}."
                f"{taken.__qualname__}): choose another name"
            )
        _SOURCES[name] = source
        return read

    return decorator


def unregister(name: str) -> None:
    """Removes source `name` (e.g. a source a test registered); raises ValueError if unknown."""
    get(name)
    del _SOURCES[name]


def names() -> tuple[str, ...]:
    """The registered source names, built-ins first, in registration order."""
    _load_builtins()
    return tuple(_SOURCES)


def get(name: str) -> Source:
    """The source registered as `name`.

    Raises:
      ValueError: for an unknown name; the message lists the registered ones.
    """
    _load_builtins()
    if name not in _SOURCES:
        raise errors.ConfigError(
            f"unknown data source data.name={name!r}: the registered sources are "
            f"{', '.join(_SOURCES)}"
        )
    return _SOURCES[name]
