"""From the `data` group of a run config to tokenized train and eval examples.

`DataConfig(**config.data)` names a dataset; `load(data_config, model_kind, workdir)` returns the
examples in the batch format that the model kind trains on (DESIGN.md, "How data flows"):
  * encoder_decoder: seq2seq pairs (source → target);
  * decoder_only: "source | target" sequences for a language model;
  * encoder_only: (text, label) classification examples.

Embedded datasets need no files: SCAN (Lake & Baroni 2018; `tfjax.data.scan`) and the
algorithmic tasks of `tfjax.data.tasks`. The word-level tokenizer is built from the training
split on the first run and saved in the workdir, so a resumed or evaluated run reuses it.
"""

import dataclasses
import logging
import os
import pathlib

from tfjax.data import packing, pipeline, scan, tasks, tokenizers

logger = logging.getLogger(__name__)

SEQ2SEQ_NAMES = ("scan", *tasks.SEQ2SEQ_TASKS)
CLASSIFY_NAMES = tasks.CLASSIFICATION_TASKS
NAMES = (*SEQ2SEQ_NAMES, *CLASSIFY_NAMES)
TOKENIZER_FILE = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The `data` config group.

    Attributes:
      name: one of `NAMES`.
      scan_split: SCAN split ("simple", "length", "addprim_jump").
      eval_split: the held-out split evaluated during training ("test").
      max_source_len: longest encoded source (EOS included); longer examples are dropped.
      max_target_len: longest encoded target (EOS included); for language models the length of
        the whole "source | target" sequence.
      num_train_examples, num_eval_examples: sizes of the generated algorithmic tasks.
      task_min_len, task_max_len, num_symbols: shape of the generated algorithmic tasks.
      pack: pack several training examples per row (`tfjax.data.packing`); eval is unpacked.
      packed_source_len, packed_target_len: packed row lengths (0 = 4 x max_source_len and
        max_target_len).
    """

    name: str = "scan"
    scan_split: str = "simple"
    eval_split: str = "test"
    max_source_len: int = 16
    max_target_len: int = 64
    num_train_examples: int = 10000
    num_eval_examples: int = 1000
    task_min_len: int = 1
    task_max_len: int = 10
    num_symbols: int = 10
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
        if self.eval_split not in ("test", "train"):
            raise ValueError(
                f"DataConfig.eval_split={self.eval_split!r} is not one of ('test', 'train')"
            )
        for field in (
            "max_source_len",
            "max_target_len",
            "num_train_examples",
            "num_eval_examples",
            "task_min_len",
            "task_max_len",
            "num_symbols",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(f"DataConfig.{field} must be > 0, got {getattr(self, field)}")


@dataclasses.dataclass
class Examples:
    """Tokenized train and eval examples plus the tokenizer that made them."""

    train: list[pipeline.Example]
    eval: list[pipeline.Example]
    tokenizer: tokenizers.WordTokenizer
    format: str  # "seq2seq", "lm" or "classify"


def _raw_splits(cfg: DataConfig, seed: int):
    """{"train": [...], "test": [...]} of raw (text, text) pairs or (text, label) examples."""
    if cfg.name == "scan":
        return scan.split(cfg.scan_split, seed=seed)
    sizes = {"train": cfg.num_train_examples, "test": cfg.num_eval_examples}
    # Distinct seeds per split: the test examples are generated independently of the train ones.
    seeds = {"train": 2 * seed, "test": 2 * seed + 1}
    if cfg.name in CLASSIFY_NAMES:
        return {
            split: tasks.classification_task(
                cfg.name,
                sizes[split],
                min_len=cfg.task_min_len,
                max_len=cfg.task_max_len,
                seed=seeds[split],
            )
            for split in sizes
        }
    make = {"copy": tasks.copy_task, "reverse": tasks.reverse_task, "sort": tasks.sort_task}
    return {
        split: make[cfg.name](
            sizes[split],
            min_len=cfg.task_min_len,
            max_len=cfg.task_max_len,
            num_symbols=cfg.num_symbols,
            seed=seeds[split],
        )
        for split in sizes
    }


def _format(cfg: DataConfig, model_kind: str) -> str:
    wanted = {"encoder_decoder": "seq2seq", "decoder_only": "lm", "encoder_only": "classify"}
    fmt = wanted[model_kind]
    if (fmt == "classify") != (cfg.name in CLASSIFY_NAMES):
        raise ValueError(
            f"data.name={cfg.name!r} cannot train a model of kind {model_kind!r}: "
            f"classification data ({CLASSIFY_NAMES}) goes with encoder_only models, "
            f"sequence data ({SEQ2SEQ_NAMES}) with encoder_decoder or decoder_only models"
        )
    return fmt


def _texts(split, fmt: str) -> list[str]:
    if fmt == "classify":
        return [text for text, _ in split]
    return [f"{source} {target}" for source, target in split]


def _tokenizer(texts: list[str], workdir: str | os.PathLike | None) -> tokenizers.WordTokenizer:
    path = None if workdir is None else pathlib.Path(workdir) / TOKENIZER_FILE
    if path is not None and path.exists():
        return tokenizers.WordTokenizer.load(path)
    tokenizer = tokenizers.WordTokenizer.build(texts)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(path)
    return tokenizer


def _encode(split, fmt: str, tokenizer, cfg: DataConfig) -> list[pipeline.Example]:
    if fmt == "seq2seq":
        return pipeline.encode_seq2seq(
            split, tokenizer, max_source_len=cfg.max_source_len, max_target_len=cfg.max_target_len
        )
    if fmt == "lm":
        texts = [f"{source} {tasks.LM_SEPARATOR} {target}" for source, target in split]
        return pipeline.encode_lm(texts, tokenizer, max_len=cfg.max_target_len)
    return pipeline.encode_classify(split, tokenizer, max_len=cfg.max_source_len)


def load(
    cfg: DataConfig, model_kind: str, *, seed: int, workdir: str | os.PathLike | None = None
) -> Examples:
    """Tokenized train and eval examples for `model_kind`; the tokenizer lives in `workdir`."""
    fmt = _format(cfg, model_kind)
    splits = _raw_splits(cfg, seed)
    texts = _texts(splits["train"], fmt)
    if fmt == "lm":
        texts.append(tasks.LM_SEPARATOR)
    tokenizer = _tokenizer(texts, workdir)
    train = _encode(splits["train"], fmt, tokenizer, cfg)
    if cfg.pack and fmt != "classify":
        unpacked = len(train)
        train = packing.pack(train, cfg.packed_lengths, seed=seed)
        logger.info("packed %d training examples into %d rows", unpacked, len(train))
    evaluation = _encode(splits[cfg.eval_split], fmt, tokenizer, cfg)
    if not train or not evaluation:
        raise ValueError(
            f"data {cfg.name!r}: {len(train)} train and {len(evaluation)} eval examples fit "
            f"max_source_len={cfg.max_source_len}, max_target_len={cfg.max_target_len}; "
            "raise those limits"
        )
    logger.info(
        "data %s: %d train, %d %s examples, vocabulary %d",
        cfg.name,
        len(train),
        len(evaluation),
        cfg.eval_split,
        tokenizer.vocab_size,
    )
    return Examples(train, evaluation, tokenizer, fmt)
