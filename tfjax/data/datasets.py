"""From the `data` group of a run config to tokenized train and eval examples.

`DataConfig(**config.data)` names a data source; `load(data_config, model_kind, workdir)` reads
its raw splits (`model_kind`: a `tfjax.models.kinds.ModelKind`, which names its example format)
and takes them down one path: tokenizer (built or loaded) → encode → drop what
does not fit the length limits → pack → `Examples`, in the batch format that the model kind
trains on (docs/design.md, "How data flows"):
  * encoder_decoder: seq2seq pairs (source → target);
  * decoder_only: "source | target" sequences for pair data, or windows over a text stream
    (`targets_weights` leaves the first token of each window out of the loss, so every other
    token is predicted with 1 to L-1 tokens of context: nanoGPT's setting for L = block + 1);
  * encoder_only: (text, label) classification examples; with the masked-LM head
    (`encoder_head="mlm"`, format "mlm") plain text lines, each "[CLS] line [SEP]" as `inputs`
    (text streams split at newlines, pair data gives each side as a line), which the train step
    masks (`tfjax.training.mlm`); tfjax's tokenizers are then built with a mask token.

Sources (`data.name`) come from `tfjax.data.registry`: the embedded generators, the checksummed
corpora, "files" and "hub" are registered in `tfjax.data.catalog`, which describes each; nothing
here depends on which source it is. The tokenizer (`data.tokenizer`: word, char or
sentencepiece, joint over source and target) is built from the training split on the first run
and saved in the workdir, so a resumed or evaluated run reuses it; with it saved, a split is
read only when first used (`Examples.deferred`).
"""

import dataclasses
import functools
import logging
import os
import pathlib
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from tfjax import errors
from tfjax.data import packing, pipeline, registry, tasks, tokenizers, workdir_tokenizer

logger = logging.getLogger(__name__)

TOKENIZERS = ("word", "char", "sentencepiece", "pretrained")
TOKENIZER_FILE = workdir_tokenizer.TOKENIZER_FILE  # word and char vocabularies
SENTENCEPIECE_FILE = workdir_tokenizer.SENTENCEPIECE_FILE
DIRECTORY = workdir_tokenizer.DIRECTORY  # a pretrained checkpoint's tokenizer files
MLM = "mlm"  # the format of encoder_only models with the masked-LM head; read as "lm" text


@runtime_checkable
class ModelKind(Protocol):
    """What this module reads of a model kind (`tfjax.models.kinds.ModelKind`, which the
    data layer does not import)."""

    name: str

    def example_format(self, encoder_head: str) -> str:
        """The example format it trains on: one of `registry.FORMATS`, or `MLM`."""

    def kinds_for(self, formats: tuple[str, ...]) -> tuple[str, ...]:
        """The names of the model kinds that train on one of `formats` (for messages)."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The `data` config group.

    Attributes:
      name: a registered source (`registry.names()`; the built-ins: `tfjax.data.catalog`).
      dir: data folder of the named corpora ("" = $TFJAX_DATA_DIR, else ~/.cache/tfjax/data;
        `tfjax.data.sources.data_dir`).
      source_lang, target_lang: translation direction (multi30k, files, hub).
      train_path, eval_path: the files of `name="files"` (see `tfjax.data.catalog`); for "hub"
        with a local builder such as "json", the data files of the train and eval splits.
      hub_name, hub_config: Hugging Face dataset and configuration ("wmt14", "de-en").
      tokenizer: "word", "char" or "sentencepiece" (joint over source and target), or
        "pretrained": the checkpoint's own tokenizer, which `experiments.convert` saved in the
        workdir (`workdir_tokenizer.DIRECTORY`); it is never built from the data.
      vocab_size: SentencePiece vocabulary size, specials included.
      spm_model_type: SentencePiece "bpe" or "unigram".
      scan_split: SCAN split ("simple", "length", "addprim_jump").
      eval_split: the held-out split evaluated during training, one of the source's splits
        (`eval_splits(name)`): "test" for embedded data and files, "val" or "test2016" for
        multi30k, "val" for tinyshakespeare, a split name for hub data; "train" everywhere.
      max_source_len: longest encoded source (EOS included); longer examples are dropped.
      max_target_len: longest encoded target (EOS included); for language models the length of
        the whole "source | target" sequence, or the window length over a text stream.
      lm_stride: start-to-start distance of training windows over a text stream (0 = L - 1,
        every token predicted once per epoch); evaluation windows always use L - 1.
      num_train_examples, num_eval_examples: sizes of the generated tasks.
      task_min_len, task_max_len, num_symbols: shape of the generated algorithmic tasks.
      listops_min_len, listops_max_len, listops_max_depth, listops_max_args: ListOps settings.
      pack: pack several training examples per row (`tfjax.data.packing`); eval is unpacked.
      packed_source_len, packed_target_len: packed row lengths (0 = 4 x max_source_len and
        max_target_len).
    """

    name: str = "scan"
    dir: str = ""
    source_lang: str = "en"
    target_lang: str = "de"
    train_path: str = ""
    eval_path: str = ""
    hub_name: str = ""
    hub_config: str = ""
    tokenizer: str = "word"
    vocab_size: int = 8000
    spm_model_type: str = "bpe"
    scan_split: str = "simple"
    eval_split: str = "test"
    max_source_len: int = 16
    max_target_len: int = 64
    lm_stride: int = 0
    num_train_examples: int = 10000
    num_eval_examples: int = 1000
    task_min_len: int = 1
    task_max_len: int = 10
    num_symbols: int = 10
    listops_min_len: int = 500
    listops_max_len: int = 2000
    listops_max_depth: int = 10
    listops_max_args: int = 10
    pack: bool = False
    packed_source_len: int = 0
    packed_target_len: int = 0

    @property
    def packed_lengths(self) -> dict[str, int]:
        return {
            "inputs": self.packed_source_len or 4 * self.max_source_len,
            "targets": self.packed_target_len or self.max_target_len,
        }

    def __post_init__(self):
        source = registry.get(self.name)  # ValueError listing the registered names
        if source.splits and self.eval_split not in source.splits:
            raise errors.ConfigError(
                f"DataConfig.eval_split={self.eval_split!r} is not a split of {self.name!r}: "
                f"choose one of {source.splits}"
            )
        if source.check is not None:
            source.check(self)
        if self.tokenizer not in TOKENIZERS:
            raise errors.ConfigError(
                f"DataConfig.tokenizer={self.tokenizer!r} is not one of {TOKENIZERS}"
            )
        if self.lm_stride < 0:
            raise errors.ConfigError(f"DataConfig.lm_stride must be >= 0, got {self.lm_stride}")
        for field in (
            "max_source_len",
            "max_target_len",
            "num_train_examples",
            "num_eval_examples",
            "task_min_len",
            "task_max_len",
            "num_symbols",
            "vocab_size",
        ):
            if getattr(self, field) <= 0:
                raise errors.ConfigError(
                    f"DataConfig.{field} must be > 0, got {getattr(self, field)}"
                )


def eval_splits(name: str) -> tuple[str, ...]:
    """The splits `data.eval_split` may name for source `name` (empty: any hub split)."""
    return registry.get(name).splits


class HeldOut(NamedTuple):
    """The encoded eval split: its examples, references (seq2seq) and token stream (text LMs)."""

    examples: list
    references: list[str] | None
    stream: np.ndarray | None


class Examples:
    """Tokenized train and eval examples plus the tokenizer that made them.

    `references` (seq2seq only) are the raw target texts of the eval examples, in order: what
    BLEU scores against, untouched by tokenization. `eval_stream` (language models on a text
    stream) holds the eval split's token ids, for window-sampled loss estimates.

    `Examples(train, eval, tokenizer, format, ...)` holds examples already encoded;
    `Examples.deferred` (what `load` gives when the workdir has its tokenizer) reads a split on
    first access: `train` the training split, `eval`, `references` and `eval_stream` the eval
    split, once for the three. So a command that only decodes reads no data, and one that
    scores the eval split does not read the training split.
    """

    def __init__(
        self,
        train: list,
        eval: list,
        tokenizer: tokenizers.Tokenizer,
        format: str,  # "seq2seq", "lm", "classify" or "mlm"
        references: list[str] | None = None,
        eval_stream: np.ndarray | None = None,
    ):
        self.tokenizer = tokenizer
        self.format = format
        # Set in the instance dict, where the cached properties below look first.
        vars(self).update(train=train, _held_out=HeldOut(eval, references, eval_stream))

    @classmethod
    def deferred(
        cls,
        tokenizer: tokenizers.Tokenizer,
        format: str,
        read_train: Callable[[], list],
        read_held_out: Callable[[], HeldOut],
    ) -> "Examples":
        """Examples whose splits come from `read_train()` and `read_held_out()` when first used."""
        examples = cls.__new__(cls)
        examples.tokenizer, examples.format = tokenizer, format
        examples._read_train, examples._read_held_out = read_train, read_held_out
        return examples

    @functools.cached_property
    def train(self) -> list:
        return self._read_train()

    @functools.cached_property
    def _held_out(self) -> HeldOut:
        return self._read_held_out()

    @property
    def eval(self) -> list:
        return self._held_out.examples

    @property
    def references(self) -> list[str] | None:
        return self._held_out.references

    @property
    def eval_stream(self) -> np.ndarray | None:
        return self._held_out.stream

    def read(self) -> "Examples":
        """Reads both splits now if they are not yet (training wants its data errors before
        it writes anything); returns self."""
        self.train  # noqa: B018
        self._held_out  # noqa: B018
        return self


def _format(source: registry.Source, model_kind: ModelKind, encoder_head: str) -> str:
    """The example format `model_kind` trains on, if `source` provides it."""
    fmt = model_kind.example_format(encoder_head)
    if fmt == MLM and "lm" not in source.formats:
        raise errors.ConfigError(
            f"data.name={source.name!r} cannot train a masked-LM model: it provides "
            f"{'/'.join(source.formats)} examples, not text (use a text file, tinyshakespeare "
            "or a generated sequence task)"
        )
    if fmt == MLM:
        return fmt
    if fmt not in source.formats:
        kinds = model_kind.kinds_for(source.formats)
        raise errors.ConfigError(
            f"data.name={source.name!r} cannot train a model of kind {model_kind.name!r}: it "
            f"provides {'/'.join(source.formats)} examples, which train {' or '.join(kinds)} "
            "models"
        )
    return fmt


def _read(source: registry.Source, cfg: DataConfig, fmt: str, seed: int, split: str):
    """The raw examples of `split` of `source`, checked to be non-empty."""
    read_format = "lm" if fmt == MLM else fmt  # masked-LM text is what language models read
    raw = source.read(registry.Request(cfg, split, seed, read_format))
    if isinstance(raw, str) and fmt not in ("lm", MLM):
        raise ValueError(
            f"data {cfg.name!r}: split {split!r} is a text stream, which only trains "
            "decoder_only models; declare the source's formats as registry.TEXT"
        )
    if len(raw) == 0:
        raise errors.DataError(f"data {cfg.name!r}: split {split!r} is empty")
    return raw


def _mlm_lines(raw) -> list[str]:
    """Masked-LM texts: the non-empty lines of a stream, or each side of every pair."""
    lines = raw.split("\n") if isinstance(raw, str) else [text for pair in raw for text in pair]
    return [line for line in lines if line.strip()]


def _tokenizer_texts(raw, fmt: str) -> list[str]:
    if isinstance(raw, str):
        return raw.split("\n")
    if fmt == MLM:
        return _mlm_lines(raw)
    if fmt == "classify":
        return [text for text, _ in raw]
    texts = [text for pair in raw for text in pair]  # joint vocabulary: sources and targets
    if fmt == "lm":
        texts.append(tasks.LM_SEPARATOR)
    return texts


def _new_tokenizer(
    cfg: DataConfig, texts: list[str], workdir, save: bool, mask: bool = False
) -> tokenizers.Tokenizer:
    """A tokenizer built from `texts` (saved in `workdir` if `save`); `mask`: with a mask
    token (masked-LM runs)."""
    if cfg.tokenizer == "pretrained":
        directory = None if workdir is None else pathlib.Path(workdir) / DIRECTORY
        raise errors.ConfigError(
            f"data.tokenizer='pretrained' reads the tokenizer of a converted checkpoint from "
            f"{directory or 'the workdir'}, which has none: make the workdir with python -m "
            "experiments.convert, or start from one with --config.train.init_from=WORKDIR"
        )
    kind = workdir_tokenizer.KINDS[cfg.tokenizer]
    if cfg.tokenizer == "sentencepiece":
        tokenizer = kind.build(
            texts, vocab_size=cfg.vocab_size, model_type=cfg.spm_model_type, mask=mask
        )
    elif cfg.tokenizer == "char":
        tokenizer = kind.build(["\n".join(texts)], mask=mask)
    else:
        tokenizer = kind.build(texts, mask=mask)
    if workdir is not None and save:
        path = workdir_tokenizer.path(cfg.tokenizer, workdir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(path)
    return tokenizer


def _stream_ids(text: str, tokenizer) -> np.ndarray:
    """Token ids of a text stream: characters as they are; words/subwords per line plus EOS."""
    if isinstance(tokenizer, tokenizers.CharTokenizer):
        return np.asarray(tokenizer.encode(text), np.int32)
    ids = [i for line in text.split("\n") if line for i in tokenizer.encode(line, add_eos=True)]
    return np.asarray(ids, np.int32)


def text_windows(ids: np.ndarray, length: int, stride: int, *, full: bool) -> list:
    """LM examples over a token stream: windows of `length` starting every `stride` tokens.

    The first token of each window is context only (`targets_weights` 0), so with
    `stride = length - 1` every token after the first is predicted exactly once. `full=False`
    keeps a last, shorter window (padded) so that evaluation covers the whole stream.

    Full windows are read-only views: their targets into one copy of `ids`, their segment ids
    and weights one shared array each, so that windows at every token (`stride=1`, nanoGPT's
    random offsets) cost a few hundred bytes each rather than three copies of the window.
    """
    if length < 2:
        raise errors.ConfigError(f"LM windows need max_target_len >= 2, got {length}")
    stream = np.array(ids, dtype=np.int32)  # a private copy: the views must not change

    def example(window: np.ndarray) -> dict[str, np.ndarray]:
        targets, segment_ids = pipeline.pad_ids(window, length)
        weights = segment_ids.copy()
        weights[0] = 0  # the first token is context only
        return {"targets": targets, "targets_segment_ids": segment_ids, "targets_weights": weights}

    shared = example(stream[:length])  # the segment ids and weights of every full window
    del shared["targets"]
    for array in (stream, *shared.values()):
        array.flags.writeable = False
    examples = []
    last = len(stream) - length if full else len(stream) - 2
    for start in range(0, last + 1, stride):
        window = stream[start : start + length]
        full_window = len(window) == length
        examples.append({**shared, "targets": window} if full_window else example(window))
    return examples


def _encode(raw, fmt: str, tokenizer, cfg: DataConfig, *, train: bool, kept=None, ids=None):
    if fmt == MLM:
        return pipeline.encode_mlm(_mlm_lines(raw), tokenizer, max_len=cfg.max_source_len)
    if isinstance(raw, str):  # a text stream for a language model
        ids = _stream_ids(raw, tokenizer) if ids is None else ids
        stride = (cfg.lm_stride or cfg.max_target_len - 1) if train else cfg.max_target_len - 1
        return text_windows(ids, cfg.max_target_len, stride, full=train)
    if fmt == "seq2seq":
        return pipeline.encode_seq2seq(
            raw,
            tokenizer,
            max_source_len=cfg.max_source_len,
            max_target_len=cfg.max_target_len,
            kept=kept,
        )
    if fmt == "lm":
        texts = [f"{source} {tasks.LM_SEPARATOR} {target}" for source, target in raw]
        return pipeline.encode_lm(texts, tokenizer, max_len=cfg.max_target_len)
    return pipeline.encode_classify(raw, tokenizer, max_len=cfg.max_source_len)


def _train_examples(raw, fmt: str, tokenizer, cfg: DataConfig, seed: int, ids=None) -> list:
    """The encoded training split, packed if `data.pack` (pair data only); `ids`: a text
    stream's tokens, if already encoded (`_stream_ids`)."""
    train = _encode(raw, fmt, tokenizer, cfg, train=True, ids=ids)
    if cfg.pack and fmt not in ("classify", MLM) and not isinstance(raw, str):
        unpacked = len(train)
        train = packing.pack(train, cfg.packed_lengths, seed=seed)
        logger.info("packed %d training examples into %d rows", unpacked, len(train))
    return train


def load(
    cfg: DataConfig,
    model_kind: ModelKind,
    *,
    seed: int,
    workdir: str | os.PathLike | None = None,
    save_tokenizer: bool = True,
    encoder_head: str = "classify",
    trained: bool = False,
    tokenizer_sha256: str | None = None,
) -> Examples:
    """Tokenized train and eval examples for `model_kind` (and `encoder_head`: "mlm" reads
    text, see the module docstring); the tokenizer lives in `workdir`.

    `save_tokenizer=False` reads the workdir's tokenizer if it is there but never writes one
    (the other processes of a multi-process run: process 0 writes it). `trained`: the
    workdir holds checkpoints trained with its tokenizer, which must then be there (it is never
    built again, by any process); `tokenizer_sha256`, the SHA-256 the workdir recorded for it,
    is checked (`workdir_tokenizer.load`).

    With the tokenizer saved in `workdir` nothing is read here: each split is read and encoded
    when first used (`Examples.deferred`), so that opening a trained workdir to decode costs no
    pass over the corpus. Without it both splits are read now, to build the tokenizer.

    Raises:
      ValueError: for data that cannot train `model_kind`, an empty split, or no example that
        fits the length limits (and the errors of the source's reader for bad files); with a
        saved tokenizer, the split's errors come when it is first used.
      tfjax.errors.DataError: for a damaged tokenizer in `workdir`, a missing one when
        `trained`, or one that is not the recorded one.
    """
    source = registry.get(cfg.name)
    fmt = _format(source, model_kind, encoder_head)
    saved = None
    if workdir is not None:
        saved = workdir_tokenizer.load(
            cfg.tokenizer,
            workdir,
            trained=trained,
            expected_sha256=tokenizer_sha256,
        )
    if saved is not None:
        logger.info("data %s: the workdir's tokenizer, vocabulary %d", cfg.name, saved.vocab_size)
        return Examples.deferred(
            saved,
            fmt,
            functools.partial(_load_train, source, cfg, fmt, saved, seed),
            functools.partial(_load_held_out, source, cfg, fmt, saved, seed),
        )
    raw_train = _read(source, cfg, fmt, seed, "train")
    raw_eval = _read(source, cfg, fmt, seed, cfg.eval_split)
    texts = _tokenizer_texts(raw_train, fmt)
    tokenizer = _new_tokenizer(cfg, texts, workdir, save_tokenizer, mask=fmt == MLM)
    train = _train_examples(raw_train, fmt, tokenizer, cfg, seed)
    held_out = _encode_held_out(raw_eval, fmt, tokenizer, cfg)
    if not train or not held_out.examples:
        raise _none_fit(cfg, f"{len(train)} train and {len(held_out.examples)} eval examples fit")
    logger.info(
        "data %s: %d train, %d %s examples, vocabulary %d",
        cfg.name,
        len(train),
        len(held_out.examples),
        cfg.eval_split,
        tokenizer.vocab_size,
    )
    return Examples(train, held_out.examples, tokenizer, fmt, held_out.references, held_out.stream)


def _none_fit(cfg: DataConfig, counts: str) -> errors.ConfigError:
    return errors.ConfigError(
        f"data {cfg.name!r}: {counts} max_source_len={cfg.max_source_len}, "
        f"max_target_len={cfg.max_target_len}; raise those limits"
    )


def _encode_held_out(raw, fmt: str, tokenizer, cfg: DataConfig) -> HeldOut:
    """The eval split encoded (unpacked), its references and its token stream."""
    kept: list[int] = []
    examples = _encode(raw, fmt, tokenizer, cfg, train=False, kept=kept)
    references = [raw[i][1] for i in kept] if fmt == "seq2seq" else None
    stream = _stream_ids(raw, tokenizer) if isinstance(raw, str) and fmt == "lm" else None
    return HeldOut(examples, references, stream)


def _load_train(source, cfg: DataConfig, fmt: str, tokenizer, seed: int) -> list:
    """The training split read and encoded with a saved tokenizer (`Examples.deferred`)."""
    raw = _read(source, cfg, fmt, seed, "train")
    ids = _stream_ids(raw, tokenizer) if isinstance(raw, str) and fmt == "lm" else None
    train = _train_examples(raw, fmt, tokenizer, cfg, seed, ids)
    if not train:
        raise _none_fit(cfg, "no train example fits")
    logger.info("data %s: %d train examples", cfg.name, len(train))
    # Word and character vocabularies are built from all of this split: an unknown token is
    # new data. SentencePiece learns from a sample (`tokenizers.SENTENCEPIECE_SAMPLE`), and a
    # pretrained tokenizer from other data: unknown tokens are expected there, not news.
    if cfg.tokenizer in ("word", "char"):
        unknown = workdir_tokenizer.unknown_tokens(train if ids is None else ids, tokenizer.unk_id)
        if unknown:
            logger.warning(
                "data %s: %d tokens of the training split are not in the workdir's tokenizer "
                "(%s) and are read as <unk>: the data changed since the tokenizer was built "
                "from it (new words or characters); train in a new workdir to learn them",
                cfg.name,
                unknown,
                workdir_tokenizer.name(cfg.tokenizer),
            )
    return train


def _load_held_out(source, cfg: DataConfig, fmt: str, tokenizer, seed: int) -> HeldOut:
    """The eval split read and encoded with a saved tokenizer (`Examples.deferred`)."""
    raw = _read(source, cfg, fmt, seed, cfg.eval_split)
    held_out = _encode_held_out(raw, fmt, tokenizer, cfg)
    if not held_out.examples:
        raise _none_fit(cfg, f"no {cfg.eval_split} example fits")
    logger.info("data %s: %d %s examples", cfg.name, len(held_out.examples), cfg.eval_split)
    return held_out


def train_row_shapes(
    cfg: DataConfig, model_kind: ModelKind, encoder_head: str = "classify"
) -> dict[str, tuple[int, ...]]:
    """The shape of each field of one training row `load` would give, without reading data.

    What ahead-of-time planning needs (`tfjax.runs.plan`): every field is int32; a batch
    stacks rows on a leading B axis. Text streams (`registry.Source.text_stream`) give
    windows of `max_target_len` with `targets_weights`; pair data gives padded rows of the
    length limits, or packed rows of `packed_lengths` with positions when `pack` is on.

    Raises:
      tfjax.errors.ConfigError: if the source cannot train `model_kind`.
    """
    source = registry.get(cfg.name)
    fmt = _format(source, model_kind, encoder_head)
    if fmt == MLM:
        return {"inputs": (cfg.max_source_len,), "inputs_segment_ids": (cfg.max_source_len,)}
    if fmt == "classify":
        length = cfg.max_source_len
        return {"inputs": (length,), "inputs_segment_ids": (length,), "labels": ()}
    if source.text_stream(cfg):
        length = cfg.max_target_len
        return {f"targets{suffix}": (length,) for suffix in ("", "_segment_ids", "_weights")}
    fields = ("inputs", "targets") if fmt == "seq2seq" else ("targets",)
    limits = {"inputs": cfg.max_source_len, "targets": cfg.max_target_len}
    lengths = cfg.packed_lengths if cfg.pack else limits
    suffixes = ("", "_segment_ids", "_positions") if cfg.pack else ("", "_segment_ids")
    return {f"{field}{suffix}": (lengths[field],) for field in fields for suffix in suffixes}


def sample_windows(ids: np.ndarray, length: int, count: int, *, seed: int) -> list:
    """`count` LM windows of `length` at uniformly random offsets (nanoGPT's loss estimate).

    Like `text_windows`, the first token of each window is context only, so each window
    scores `length - 1` predictions with 1 to `length - 1` tokens of context.
    """
    if len(ids) < length:
        raise errors.DataError(f"a stream of {len(ids)} tokens has no window of {length}")
    starts = np.random.default_rng(seed).integers(0, len(ids) - length + 1, size=count)
    return [text_windows(ids[s : s + length], length, 1, full=True)[0] for s in starts]
