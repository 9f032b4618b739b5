"""From the `data` group of a run config to tokenized train and eval examples.

`DataConfig(**config.data)` names a dataset; `load(data_config, model_kind, workdir)` returns the
examples in the batch format that the model kind trains on (DESIGN.md, "How data flows"):
  * encoder_decoder: seq2seq pairs (source → target);
  * decoder_only: "source | target" sequences for pair data, or windows over a text stream
    (`targets_weights` leaves the first token of each window out of the loss, so every other
    token is predicted with 1 to L-1 tokens of context: nanoGPT's setting for L = block + 1);
  * encoder_only: (text, label) classification examples.

Datasets (`data.name`):
  * embedded, no files: "scan" (Lake & Baroni 2018), the algorithmic tasks of `tfjax.data.tasks`
    and "listops" (`tfjax.data.listops`);
  * named local corpora, checksummed (`tfjax.data.sources`): "multi30k", "tinyshakespeare";
  * "files": your own files. `train_path`/`eval_path` name line-aligned prefixes
    (`corpus/train` reads `corpus/train.{source_lang}` and `.{target_lang}`) or TSV files
    (source\ttarget for translation, text\tlabel for classification) or, for decoder_only
    models, plain text (no `eval_path`: the last 10% of the training text);
  * "hub": Hugging Face datasets (`hub_name`, `hub_config`; the `hub` extra).
The tokenizer (`data.tokenizer`: word, char or sentencepiece, joint over source and target) is
built from the training split on the first run and saved in the workdir, so a resumed or
evaluated run reuses it.
"""

import dataclasses
import logging
import os
import pathlib

import numpy as np

from tfjax.data import packing, pipeline, scan, sources, tasks, tokenizers

logger = logging.getLogger(__name__)

SEQ2SEQ_NAMES = ("scan", *tasks.SEQ2SEQ_TASKS)
CLASSIFY_NAMES = (*tasks.CLASSIFICATION_TASKS, "listops")
CORPUS_NAMES = ("multi30k", "tinyshakespeare", "files", "hub")
NAMES = (*SEQ2SEQ_NAMES, *CLASSIFY_NAMES, *CORPUS_NAMES)
TOKENIZERS = ("word", "char", "sentencepiece")
TOKENIZER_FILE = "tokenizer.json"  # word and char vocabularies
SENTENCEPIECE_FILE = "tokenizer.model"
TEXT_EVAL_FRACTION = 0.1  # plain-text LM files without eval_path: the last 10% is eval


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The `data` config group.

    Attributes:
      name: one of `NAMES` (see the module docstring).
      dir: data folder of the named corpora ("" = $TFJAX_DATA_DIR, else ../shared/data).
      source_lang, target_lang: translation direction (multi30k, files, hub).
      train_path, eval_path: the files of `name="files"` (see the module docstring); for "hub"
        with a local builder such as "json", the data files of the train and eval splits.
      hub_name, hub_config: Hugging Face dataset and configuration ("wmt14", "de-en").
      tokenizer: "word", "char" or "sentencepiece" (joint over source and target).
      vocab_size: SentencePiece vocabulary size, specials included.
      spm_model_type: SentencePiece "bpe" or "unigram".
      scan_split: SCAN split ("simple", "length", "addprim_jump").
      eval_split: the held-out split evaluated during training: "test" for embedded data and
        files, "val" or "test2016" for multi30k, "val" for tinyshakespeare, a split name for
        hub data; "train" everywhere.
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
        if self.name not in NAMES:
            raise ValueError(f"DataConfig.name={self.name!r} is not one of {NAMES}")
        if self.name == "scan" and self.scan_split not in scan.SPLITS:
            raise ValueError(
                f"DataConfig.scan_split={self.scan_split!r} is not one of {scan.SPLITS}"
            )
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"DataConfig.tokenizer={self.tokenizer!r} is not one of {TOKENIZERS}")
        splits = eval_splits(self.name)
        if splits and self.eval_split not in splits:
            raise ValueError(
                f"DataConfig.eval_split={self.eval_split!r} is not a split of {self.name!r}: "
                f"choose one of {splits}"
            )
        if self.name == "files" and not self.train_path:
            raise ValueError("data.name='files' needs data.train_path (see DataConfig)")
        if self.name == "hub" and not self.hub_name:
            raise ValueError("data.name='hub' needs data.hub_name, e.g. 'wmt14'")
        if self.lm_stride < 0:
            raise ValueError(f"DataConfig.lm_stride must be >= 0, got {self.lm_stride}")
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
                raise ValueError(f"DataConfig.{field} must be > 0, got {getattr(self, field)}")


def eval_splits(name: str) -> tuple[str, ...]:
    """The splits `data.eval_split` may name for dataset `name` (empty: any hub split)."""
    if name == "multi30k":
        return sources.MULTI30K_SPLITS
    if name == "tinyshakespeare":
        return sources.SHAKESPEARE_SPLITS
    if name == "hub":
        return ()
    return ("test", "train")


@dataclasses.dataclass
class Examples:
    """Tokenized train and eval examples plus the tokenizer that made them.

    `references` (seq2seq only) are the raw target texts of the eval examples, in order: what
    BLEU scores against, untouched by tokenization. `eval_stream` (language models on a text
    stream) holds the eval split's token ids, for window-sampled loss estimates.
    """

    train: list[pipeline.Example]
    eval: list[pipeline.Example]
    tokenizer: tokenizers.Tokenizer
    format: str  # "seq2seq", "lm" or "classify"
    references: list[str] | None = None
    eval_stream: np.ndarray | None = None


def _generated(cfg: DataConfig, split: str, seed: int):
    """Raw examples of an embedded dataset: (text, text) pairs or (text, label) examples."""
    if cfg.name == "scan":
        return scan.split(cfg.scan_split, seed=seed)[split]
    # Distinct seeds per split: the test examples are generated independently of the train ones.
    size = cfg.num_train_examples if split == "train" else cfg.num_eval_examples
    split_seed = 2 * seed if split == "train" else 2 * seed + 1
    if cfg.name == "listops":
        from tfjax.data import listops

        return listops.generate(
            size,
            seed=split_seed,
            min_length=cfg.listops_min_len,
            max_length=cfg.listops_max_len,
            max_depth=cfg.listops_max_depth,
            max_args=cfg.listops_max_args,
        )
    if cfg.name in CLASSIFY_NAMES:
        return tasks.classification_task(
            cfg.name, size, min_len=cfg.task_min_len, max_len=cfg.task_max_len, seed=split_seed
        )
    make = {"copy": tasks.copy_task, "reverse": tasks.reverse_task, "sort": tasks.sort_task}
    return make[cfg.name](
        size,
        min_len=cfg.task_min_len,
        max_len=cfg.task_max_len,
        num_symbols=cfg.num_symbols,
        seed=split_seed,
    )


def _from_files(cfg: DataConfig, split: str, fmt: str):
    """Raw examples of `name="files"`: pairs, (text, label) rows or a text string."""
    path = cfg.train_path if split == "train" else cfg.eval_path
    if fmt == "classify":
        if not path:
            raise ValueError("classification files need data.eval_path for evaluation")
        return sources.read_classification(path)
    if fmt == "lm" and not path.endswith(".tsv") and not _is_prefix(cfg, path):
        if not cfg.eval_path:  # one text file: the last 10% evaluates
            text = sources.read_text(cfg.train_path)
            part = "train" if split == "train" else "val"
            return sources.split_text(text, part, 1 - TEXT_EVAL_FRACTION)
        return sources.read_text(path)
    if not path:
        raise ValueError("translation files need data.eval_path for evaluation")
    if path.endswith(".tsv"):
        return sources.read_parallel(path)
    return sources.read_parallel(f"{path}.{cfg.source_lang}", f"{path}.{cfg.target_lang}")


def _is_prefix(cfg: DataConfig, path: str) -> bool:
    return bool(path) and pathlib.Path(f"{path}.{cfg.source_lang}").is_file()


def _raw(cfg: DataConfig, split: str, fmt: str, seed: int):
    """Raw examples of `split`: pairs, (text, label) rows, or one string (text LM)."""
    if cfg.name == "multi30k":
        root = sources.data_dir(cfg.dir)
        return sources.multi30k(
            root, split, source_lang=cfg.source_lang, target_lang=cfg.target_lang
        )
    if cfg.name == "tinyshakespeare":
        return sources.tinyshakespeare(sources.data_dir(cfg.dir), split)
    if cfg.name == "files":
        return _from_files(cfg, split, fmt)
    if cfg.name == "hub":
        files = cfg.train_path if split == "train" else cfg.eval_path
        return sources.hub_pairs(
            cfg.hub_name,
            split,
            config=cfg.hub_config,
            source_lang=cfg.source_lang,
            target_lang=cfg.target_lang,
            data_files=files or None,
        )
    return _generated(cfg, split, seed)


def _format(cfg: DataConfig, model_kind: str) -> str:
    wanted = {"encoder_decoder": "seq2seq", "decoder_only": "lm", "encoder_only": "classify"}
    fmt = wanted[model_kind]
    classify_data = cfg.name in CLASSIFY_NAMES
    sequence_data = cfg.name in SEQ2SEQ_NAMES or cfg.name in ("multi30k", "hub")
    if (fmt == "classify" and sequence_data) or (fmt != "classify" and classify_data):
        raise ValueError(
            f"data.name={cfg.name!r} cannot train a model of kind {model_kind!r}: "
            f"classification data ({CLASSIFY_NAMES}) goes with encoder_only models, "
            f"sequence data ({SEQ2SEQ_NAMES}, multi30k, hub) with encoder_decoder or "
            "decoder_only models"
        )
    if cfg.name == "tinyshakespeare" and fmt != "lm":
        raise ValueError("tinyshakespeare is plain text: train a decoder_only model on it")
    return fmt


def _tokenizer_texts(raw, fmt: str) -> list[str]:
    if isinstance(raw, str):
        return raw.split("\n")
    if fmt == "classify":
        return [text for text, _ in raw]
    texts = [text for pair in raw for text in pair]  # joint vocabulary: sources and targets
    if fmt == "lm":
        texts.append(tasks.LM_SEPARATOR)
    return texts


def _tokenizer(cfg: DataConfig, texts: list[str], workdir) -> tokenizers.Tokenizer:
    """The workdir's saved tokenizer, or a new one built from `texts` (and saved there)."""
    spm = cfg.tokenizer == "sentencepiece"
    kind = {
        "word": tokenizers.WordTokenizer,
        "char": tokenizers.CharTokenizer,
        "sentencepiece": tokenizers.SentencePieceTokenizer,
    }[cfg.tokenizer]
    name = SENTENCEPIECE_FILE if spm else TOKENIZER_FILE
    path = None if workdir is None else pathlib.Path(workdir) / name
    if path is not None and path.exists():
        return kind.load(path)
    if spm:
        tokenizer = kind.build(texts, vocab_size=cfg.vocab_size, model_type=cfg.spm_model_type)
    elif cfg.tokenizer == "char":
        tokenizer = kind.build(["\n".join(texts)])
    else:
        tokenizer = kind.build(texts)
    if path is not None:
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
    """
    if length < 2:
        raise ValueError(f"LM windows need max_target_len >= 2, got {length}")
    examples = []
    last = len(ids) - length if full else len(ids) - 2
    for start in range(0, last + 1, stride):
        window = ids[start : start + length]
        targets, segment_ids = pipeline.pad_ids(window, length)
        weights = segment_ids.copy()
        weights[0] = 0
        examples.append(
            {"targets": targets, "targets_segment_ids": segment_ids, "targets_weights": weights}
        )
    return examples


def _encode(raw, fmt: str, tokenizer, cfg: DataConfig, *, train: bool, kept=None) -> list:
    if isinstance(raw, str):  # a text stream for a language model
        ids = _stream_ids(raw, tokenizer)
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


def load(
    cfg: DataConfig, model_kind: str, *, seed: int, workdir: str | os.PathLike | None = None
) -> Examples:
    """Tokenized train and eval examples for `model_kind`; the tokenizer lives in `workdir`.

    Raises:
      ValueError: for data that cannot train `model_kind`, an empty split, or no example that
        fits the length limits (and the errors of `tfjax.data.sources` for bad files).
    """
    fmt = _format(cfg, model_kind)
    raw_train = _raw(cfg, "train", fmt, seed)
    raw_eval = _raw(cfg, cfg.eval_split, fmt, seed)
    for split, raw in (("train", raw_train), (cfg.eval_split, raw_eval)):
        if len(raw) == 0:
            raise ValueError(f"data {cfg.name!r}: split {split!r} is empty")
    tokenizer = _tokenizer(cfg, _tokenizer_texts(raw_train, fmt), workdir)
    train = _encode(raw_train, fmt, tokenizer, cfg, train=True)
    if cfg.pack and fmt != "classify" and not isinstance(raw_train, str):
        unpacked = len(train)
        train = packing.pack(train, cfg.packed_lengths, seed=seed)
        logger.info("packed %d training examples into %d rows", unpacked, len(train))
    kept: list[int] = []
    evaluation = _encode(raw_eval, fmt, tokenizer, cfg, train=False, kept=kept)
    if not train or not evaluation:
        raise ValueError(
            f"data {cfg.name!r}: {len(train)} train and {len(evaluation)} eval examples fit "
            f"max_source_len={cfg.max_source_len}, max_target_len={cfg.max_target_len}; "
            "raise those limits"
        )
    references = [raw_eval[i][1] for i in kept] if fmt == "seq2seq" else None
    stream = _stream_ids(raw_eval, tokenizer) if isinstance(raw_eval, str) else None
    logger.info(
        "data %s: %d train, %d %s examples, vocabulary %d",
        cfg.name,
        len(train),
        len(evaluation),
        cfg.eval_split,
        tokenizer.vocab_size,
    )
    return Examples(train, evaluation, tokenizer, fmt, references, stream)


def sample_windows(ids: np.ndarray, length: int, count: int, *, seed: int) -> list:
    """`count` LM windows of `length` at uniformly random offsets (nanoGPT's loss estimate).

    Like `text_windows`, the first token of each window is context only, so each window
    scores `length - 1` predictions with 1 to `length - 1` tokens of context.
    """
    if len(ids) < length:
        raise ValueError(f"a stream of {len(ids)} tokens has no window of {length}")
    starts = np.random.default_rng(seed).integers(0, len(ids) - length + 1, size=count)
    return [text_windows(ids[s : s + length], length, 1, full=True)[0] for s in starts]
