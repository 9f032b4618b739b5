"""The registry of model kinds: `model.kind` → one frozen `ModelKind` record.

A model kind is one Flax module and one `register(ModelKind(...))` beside it (the built-in
three at the end of `encoder_decoder`, `encoder_only` and `decoder_only`; a new one from any
module imported before its config is built, as `tests/test_model_kinds.py` does). Every layer
that used to compare `model.kind` with a name asks the record instead:

  * `models.create_model`: `model`, the class built from the `ModelConfig`;
  * `tfjax.data.datasets`: `data_format`, the example format the kind trains on
    (`tfjax.data.registry.FORMATS`), and `heads` (a `ModelConfig.encoder_head` of "mlm"
    trains on masked text instead: `example_format`);
  * `tfjax.training.steps` and the data lengths: `fields`, the batch fields the model reads
    in the order of its positional arguments ("inputs" for an encoder, "targets" for a
    decoder; each with its `_segment_ids` and `_positions`: `input_keys`, and its length
    limit in the `data` config: `lengths`);
  * the loss and metrics: `scores`, "targets" (token cross-entropy over the target ids,
    weighted by their segment ids) or "labels" (one class per row);
  * `tfjax.models.flops`: `counts(cfg, source_len, target_len) -> Counts`;
  * `tfjax.inference`: `decoding`, what generation is conditioned on: "source" (an encoded
    source, then a decoder; greedy, sampling and beam search), "prompt" (a prompt's tokens in
    the decoder's cache) or None (the kind does not generate);
  * `tfjax.runs.trained`: `facade`, the class a restored workdir becomes ("translator",
    "generator" or "trained"), `tool`, the command that decodes it, and `train_example`,
    the config suggested to train one.

Why descriptors (short strings) rather than the higher layers' classes and functions: this
module is in `models/`, which imports only `nn/` (tests/test_package.py), so it cannot name
`tfjax.data`'s formats, `tfjax.training`'s losses or `tfjax.runs.trained`'s classes. Each
descriptor is mapped to code once, in the layer that owns the code (the loss in
`training/steps.py`, the facade in `runs/trained.py`); a new kind picks among those, and needs
an edit there only if it brings a new loss, decoding or facade. What belongs to the models
layer itself, the module class and the FLOPs formula, is held as code.
"""

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from tfjax import errors

# The modules that register the built-in kinds, in the order `names()` lists them.
BUILTINS = (
    "tfjax.models.encoder_decoder",
    "tfjax.models.encoder_only",
    "tfjax.models.decoder_only",
)
DATA_FORMATS = ("seq2seq", "lm", "classify")  # tfjax.data.registry.FORMATS
FIELDS = ("inputs", "targets")  # an encoder reads "inputs", a decoder "targets"
SCORES = ("targets", "labels")
DECODINGS = ("source", "prompt", None)
FACADES = ("translator", "generator", "trained")
_LENGTHS = {"inputs": "max_source_len", "targets": "max_target_len"}


@dataclasses.dataclass(frozen=True)
class Counts:
    """What `tfjax.models.flops` needs of one row of S source and L target tokens.

    Attributes:
      attention_pairs: Σ over attention layers of query positions × key positions.
      output_tokens: positions that go through the output layer (L, S or 1).
      vocab_output: whether the output layer is over the vocabulary (so it may be tied).
    """

    attention_pairs: int
    output_tokens: int
    vocab_output: bool


@dataclasses.dataclass(frozen=True)
class ModelKind:
    """A registered model kind (see the module docstring for who reads which field).

    Attributes:
      name: the `model.kind` that selects it.
      model: the Flax module class, built as `model(config)`.
      fields: the batch fields of its positional arguments, a subset of `FIELDS` in order.
      data_format: the example format it trains on, one of `DATA_FORMATS`.
      scores: "targets" or "labels" (`SCORES`).
      counts: `counts(cfg, source_len, target_len) -> Counts` for the FLOPs formula.
      decoding: one of `DECODINGS`.
      facade: one of `FACADES`.
      tool: the command that decodes or scores a workdir of this kind.
      train_example: a `--config=` that trains one (named in messages).
      heads: the `ModelConfig.encoder_head` values it reads ("mlm" among them: masked text).
    """

    name: str
    model: type
    fields: tuple[str, ...]
    data_format: str
    scores: str
    counts: Callable[[Any, int, int], Counts]
    decoding: str | None
    facade: str
    tool: str
    train_example: str
    heads: tuple[str, ...] = ()

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The batch keys the model takes: the fields, their segment ids, their positions."""
        return (
            *self.fields,
            *(f"{field}_segment_ids" for field in self.fields),
            *(f"{field}_positions" for field in self.fields),
        )

    @property
    def lengths(self) -> tuple[str, ...]:
        """The `data` config's length limits of its fields ("max_source_len", ...)."""
        return tuple(_LENGTHS[field] for field in self.fields)

    def example_format(self, encoder_head: str) -> str:
        """The example format of a run: "mlm" for the masked-LM head, else `data_format`."""
        return "mlm" if encoder_head == "mlm" and "mlm" in self.heads else self.data_format

    def kinds_for(self, formats: Iterable[str]) -> tuple[str, ...]:
        """The registered kinds that train on one of `formats` (for messages)."""
        return tuple(name for name in names() if get(name).data_format in tuple(formats))


_KINDS: dict[str, ModelKind] = {}


def _check(kind: ModelKind) -> None:
    for field, allowed in (
        ("data_format", DATA_FORMATS),
        ("scores", SCORES),
        ("decoding", DECODINGS),
        ("facade", FACADES),
    ):
        if getattr(kind, field) not in allowed:
            raise ValueError(f"ModelKind {field}={getattr(kind, field)!r}: one of {allowed}")
    if not kind.fields or any(field not in FIELDS for field in kind.fields):
        raise ValueError(f"ModelKind fields={kind.fields!r}: a non-empty subset of {FIELDS}")


def register(kind: ModelKind) -> ModelKind:
    """Registers `kind` under `kind.name` and returns it.

    Raises:
      ValueError: for a name already registered or a field outside its allowed values.
    """
    _check(kind)
    if kind.name in _KINDS:
        raise ValueError(f"model kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Removes the kind `name` (tests that register their own)."""
    _KINDS.pop(name, None)


def _load_builtins() -> None:
    for module in BUILTINS:
        importlib.import_module(module)


def names(**match: Any) -> tuple[str, ...]:
    """The registered kinds, built-ins first (`BUILTINS` order), with every field in `match`
    equal to its value (e.g. `names(facade="translator")`)."""
    _load_builtins()

    def rank(kind: ModelKind) -> int:
        module = kind.model.__module__
        return BUILTINS.index(module) if module in BUILTINS else len(BUILTINS)

    ordered = sorted(_KINDS.values(), key=rank)  # stable: the others in registration order
    return tuple(k.name for k in ordered if all(getattr(k, f) == v for f, v in match.items()))


def get(name: str) -> ModelKind:
    """The kind registered as `name`.

    Raises:
      tfjax.errors.ConfigError: for a name no module registered, listing the registered ones.
    """
    _load_builtins()
    if name not in _KINDS:
        raise errors.ConfigError(f"model.kind={name!r} is not one of {names()}")
    return _KINDS[name]
