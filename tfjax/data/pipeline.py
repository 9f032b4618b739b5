"""Tokenized examples → batches of int32 numpy arrays on grain, with resumable iterators.

Batch formats (docs/design.md, "How data flows"); id 0 pads, and padding is always read from segment
ids (0 = padding, 1 = a real token of an unpacked row), never from token values:
  * seq2seq: `inputs` [B, S], `inputs_segment_ids` [B, S], `targets` [B, L],
    `targets_segment_ids` [B, L]; inputs = source + EOS, targets = target + EOS (no BOS: the
    model shifts targets right and inserts BOS itself).
  * lm: `targets` [B, L], `targets_segment_ids` [B, L]; targets = text + EOS.
  * classify: `inputs` [B, S], `inputs_segment_ids` [B, S], `labels` [B]; inputs = BOS + text,
    BOS acting as [CLS]. Padding rows carry label -1 (`LABEL_PADDING`).
  * mlm: `inputs` [B, S], `inputs_segment_ids` [B, S]; inputs = BOS + text + EOS ([CLS] text
    [SEP]), masked in the train step.

`make_dataset` builds a grain `MapDataset` (grain's random-access API: a deterministic global
shuffle, reseeded each epoch, and per-host sharding by index); `BatchIterator` wraps its iterator
and exposes grain's small JSON state so a run restored from a checkpoint continues with exactly
the batches that would have come next.
"""

import functools
import logging
import math
from collections.abc import Mapping, Sequence

import grain
import numpy as np

from tfjax import errors
from tfjax.data import tokenizers

logger = logging.getLogger(__name__)

LABEL_PADDING = -1  # The label of all-padding classification rows.
_PAD_VALUES = {"labels": LABEL_PADDING}  # Every other field pads with 0.

Example = dict[str, np.ndarray]


def pad_ids(ids, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`ids` (a list or array) padded to `length`: (tokens, segment_ids), both [length] int32."""
    tokens = np.zeros(length, dtype=np.int32)
    tokens[: len(ids)] = ids
    segment_ids = np.zeros(length, dtype=np.int32)
    segment_ids[: len(ids)] = 1
    return tokens, segment_ids


def _log_dropped(kind: str, num_dropped: int, total: int, fix: str) -> None:
    if num_dropped:
        logger.warning(
            "Dropped %d of %d %s examples as too long: %s.", num_dropped, total, kind, fix
        )


def encode_seq2seq(
    pairs: Sequence[tuple[str, str]],
    tokenizer: tokenizers.Tokenizer,
    *,
    max_source_len: int,
    max_target_len: int,
    kept: list[int] | None = None,
) -> list[Example]:
    """Tokenizes (source, target) pairs into padded seq2seq examples.

    Args:
        pairs: (source, target) texts.
        tokenizer: maps words to ids.
        max_source_len: S, the padded length of `inputs` (EOS included).
        max_target_len: L, the padded length of `targets` (EOS included).
        kept: if given, the indices of the kept pairs are appended to it.

    Returns:
        One dict per kept pair: `inputs`, `inputs_segment_ids` [S] int32 and `targets`,
        `targets_segment_ids` [L] int32. Pairs that do not fit are dropped and counted in a
        warning on `logger`; `len(pairs) - len(result)` is their number.
    """
    examples = []
    for index, (source, target) in enumerate(pairs):
        inputs = tokenizer.encode(source, add_eos=True)
        targets = _encode_target(tokenizer, target)
        if len(inputs) > max_source_len or len(targets) > max_target_len:
            continue
        if kept is not None:
            kept.append(index)
        inputs, inputs_segment_ids = pad_ids(inputs, max_source_len)
        targets, targets_segment_ids = pad_ids(targets, max_target_len)
        examples.append(
            {
                "inputs": inputs,
                "inputs_segment_ids": inputs_segment_ids,
                "targets": targets,
                "targets_segment_ids": targets_segment_ids,
            }
        )
    fix = "raise max_source_len or max_target_len"
    _log_dropped("seq2seq", len(pairs) - len(examples), len(pairs), fix)
    return examples


def _encode_target(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
    """Target ids with EOS: a pretrained tokenizer's target side (Marian's target model)."""
    if isinstance(tokenizer, tokenizers.PretrainedTokenizer):
        return tokenizer.encode_target(text, add_eos=True)
    return tokenizer.encode(text, add_eos=True)


def encode_lm(
    texts: Sequence[str], tokenizer: tokenizers.Tokenizer, *, max_len: int
) -> list[Example]:
    """Tokenizes texts into padded decoder-only examples.

    Args:
        texts: one sequence each (e.g. "s3 s1 | s1 s3", a task pair joined by
            `tasks.LM_SEPARATOR`).
        tokenizer: maps words to ids.
        max_len: L, the padded length of `targets` (EOS included).

    Returns:
        One dict per kept text: `targets`, `targets_segment_ids` [L] int32. Texts that do not
        fit are dropped and counted in a warning on `logger`.
    """
    examples = []
    for text in texts:
        ids = tokenizer.encode(text, add_eos=True)
        if len(ids) <= max_len:
            targets, targets_segment_ids = pad_ids(ids, max_len)
            examples.append({"targets": targets, "targets_segment_ids": targets_segment_ids})
    _log_dropped("lm", len(texts) - len(examples), len(texts), "raise max_len")
    return examples


def encode_classify(
    examples: Sequence[tuple[str, int]], tokenizer: tokenizers.Tokenizer, *, max_len: int
) -> list[Example]:
    """Tokenizes (text, label) pairs into padded classification examples.

    Args:
        examples: (text, label) pairs, labels >= 0.
        tokenizer: maps words to ids.
        max_len: S, the padded length of `inputs` (the leading BOS included).

    Returns:
        One dict per kept example: `inputs`, `inputs_segment_ids` [S] int32 and `labels` []
        int32. Examples that do not fit are dropped and counted in a warning on `logger`.

    Raises:
        ValueError: for a negative label (negative labels mark padding rows).
    """
    encoded = []
    for text, label in examples:
        if label < 0:
            raise errors.DataError(f"Label {label} of {text!r} is negative: labels must be >= 0.")
        ids = tokenizer.encode(text, add_bos=True)
        if len(ids) <= max_len:
            inputs, inputs_segment_ids = pad_ids(ids, max_len)
            labels = np.asarray(label, dtype=np.int32)
            encoded.append(
                {"inputs": inputs, "inputs_segment_ids": inputs_segment_ids, "labels": labels}
            )
    _log_dropped("classify", len(examples) - len(encoded), len(examples), "raise max_len")
    return encoded


def encode_mlm(
    texts: Sequence[str], tokenizer: tokenizers.Tokenizer, *, max_len: int
) -> list[Example]:
    """Tokenizes text lines into padded masked-LM examples ("[CLS] text [SEP]", BOS and EOS).

    Args:
        texts: one line each.
        tokenizer: maps words to ids.
        max_len: S, the padded length of `inputs` (BOS and EOS included).

    Returns:
        One dict per kept line: `inputs`, `inputs_segment_ids` [S] int32 (no labels: the train
        step masks the inputs, `tfjax.training.mlm`). Lines that do not fit are dropped and
        counted in a warning on `logger`.
    """
    examples = []
    for text in texts:
        ids = tokenizer.encode(text, add_bos=True, add_eos=True)
        if len(ids) <= max_len:
            inputs, inputs_segment_ids = pad_ids(ids, max_len)
            examples.append({"inputs": inputs, "inputs_segment_ids": inputs_segment_ids})
    _log_dropped("mlm", len(texts) - len(examples), len(texts), "raise max_source_len")
    return examples


def _stack(examples: Sequence[Mapping[str, np.ndarray]]) -> Example:
    """Stacks examples field by field into [B, ...] int32 arrays."""
    return {key: np.stack([e[key] for e in examples]).astype(np.int32) for key in examples[0]}


def _padding_like(example: Mapping[str, np.ndarray], rows: int) -> Example:
    """`rows` all-padding rows shaped like `example` (a batch): zeros, labels -1."""
    return {
        key: np.full((rows, *value.shape[1:]), _PAD_VALUES.get(key, 0), dtype=np.int32)
        for key, value in example.items()
    }


def pad_batch(batch: Mapping[str, np.ndarray], batch_size: int) -> Example:
    """Pads a partial batch up to `batch_size` rows with all-padding rows.

    Padding rows have segment ids 0 (so zero loss weight), tokens 0 and, for classification,
    labels -1 (`LABEL_PADDING`), which keeps shapes static for jit and pmap.

    Args:
        batch: fields with a shared leading axis B <= batch_size, e.g. `inputs` [B, S] int32.
        batch_size: the rows wanted.

    Returns:
        The same fields with leading axis `batch_size`, int32.

    Raises:
        ValueError: if the batch is empty, the fields disagree on B or B > batch_size.
    """
    rows = {key: value.shape[0] for key, value in batch.items()}
    if len(set(rows.values())) != 1:
        raise ValueError(f"Batch fields must share one batch axis length, got {rows}.")
    num_rows = next(iter(rows.values()))
    if num_rows > batch_size:
        raise ValueError(f"Batch has {num_rows} rows, more than batch_size={batch_size}.")
    padding = _padding_like(batch, batch_size - num_rows)
    return {
        key: np.concatenate([value, padding[key]]).astype(np.int32) for key, value in batch.items()
    }


def _check_dataset_args(num_examples: int, batch_size: int, shard_index: int, shard_count: int):
    if batch_size < 1:
        raise errors.ConfigError(f"batch_size must be >= 1, got {batch_size}.")
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ValueError(
            f"Need 0 <= shard_index < shard_count, got shard_index={shard_index}, "
            f"shard_count={shard_count}: pass jax.process_index() and jax.process_count()."
        )
    if num_examples < shard_count:
        raise errors.DataError(
            f"{num_examples} examples cannot fill {shard_count} shards: every host needs at least "
            "one example; use more data or fewer shards."
        )


def _pad_shard(shard: grain.MapDataset, length: int, template: Mapping) -> grain.MapDataset:
    """Extends `shard` with all-padding examples up to `length` (equal batch counts per host)."""
    num_real = len(shard)
    padding = {key: row[0] for key, row in _padding_like(_stack([template]), 1).items()}
    return grain.MapDataset.range(length).map(lambda i: shard[i] if i < num_real else padding)


def make_dataset(
    examples: Sequence[Mapping[str, np.ndarray]],
    *,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    repeat: bool = True,
    drop_remainder: bool = True,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.MapDataset:
    """Batches encoded examples: shard → shuffle → repeat → batch.

    Training uses the defaults: an endless stream of full batches, globally shuffled with a
    permutation that is fixed by `seed` and changes every epoch. Evaluation uses
    `shuffle=False, repeat=False, drop_remainder=False`: every example of the shard once, in
    order, the last batch padded by `pad_batch`; with several shards, short shards are padded
    with all-padding rows so that every host runs the same number of batches.

    Args:
        examples: encoded examples from `encode_seq2seq`, `encode_lm` or `encode_classify`.
        batch_size: B, rows per batch on this host.
        seed: seeds the shuffle (ignored when `shuffle=False`).
        shuffle: shuffle globally, differently each epoch.
        repeat: repeat forever.
        drop_remainder: drop a last partial batch; if False it is padded to `batch_size`.
        shard_index: this host's shard, usually `jax.process_index()`; it reads examples
            shard_index, shard_index + shard_count, ...
        shard_count: number of shards, usually `jax.process_count()`.

    Returns:
        A grain `MapDataset` of dicts of [B, ...] int32 arrays; wrap it in `BatchIterator`.

    Raises:
        ValueError: for batch_size < 1, an invalid shard or fewer examples than shards.
    """
    _check_dataset_args(len(examples), batch_size, shard_index, shard_count)
    dataset = grain.MapDataset.source(examples).slice(slice(shard_index, None, shard_count))
    if not repeat and not drop_remainder:
        dataset = _pad_shard(dataset, math.ceil(len(examples) / shard_count), examples[0])
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder, batch_fn=_stack)
    if not drop_remainder:
        dataset = dataset.map(functools.partial(pad_batch, batch_size=batch_size))
    return dataset


def make_host_dataset(
    examples: Sequence[Mapping[str, np.ndarray]],
    *,
    global_batch_size: int,
    rows: slice,
    seed: int,
) -> grain.MapDataset:
    """Training batches for one host of several: rows `rows` of every global batch.

    Every host orders all examples with the same global shuffle (fixed by `seed`, changing every
    epoch, as `make_dataset`) and cuts that stream into global batches of `global_batch_size`;
    this host reads only its `rows` of each, without touching the other rows. So the global
    batch is the same for any number of hosts (the trained model too), and the iterator state
    (global batches read) means the same on every host: a checkpoint written by one process
    count resumes on another. One host (`rows=slice(0, global_batch_size)`) gives exactly
    the batches of `make_dataset(examples, batch_size=global_batch_size, seed=seed)`.

    Args:
        examples: encoded examples, as for `make_dataset`.
        global_batch_size: G, rows of one global batch (all hosts together).
        rows: this host's block of each global batch, `0 <= start < stop <= G`; from
            `tfjax.parallel.strategies` (`strategy.host_rows(G)`).
        seed: seeds the shuffle.

    Returns:
        A grain `MapDataset` of dicts of [stop - start, ...] int32 arrays; wrap it in
        `BatchIterator`.
    """
    width = rows.stop - rows.start
    if global_batch_size < 1 or not 0 <= rows.start < rows.stop <= global_batch_size:
        raise ValueError(f"rows {rows} are not a block of a global batch of {global_batch_size}")
    _check_dataset_args(len(examples), global_batch_size, 0, 1)
    stream = grain.MapDataset.source(examples).shuffle(seed=seed).repeat()

    def pick(k: int) -> Mapping[str, np.ndarray]:  # this host's k-th example
        batch, row = divmod(k, width)
        return stream[batch * global_batch_size + rows.start + row]

    picked = grain.MapDataset.range(len(stream) // global_batch_size * width).map(pick)
    return picked.batch(width, drop_remainder=True, batch_fn=_stack)


class BatchIterator:
    """Iterates over a dataset's batches; its state can be saved and restored.

    `get_state()` returns grain's iterator state, a small JSON-serialisable dict (e.g.
    `{"next_index": 5}`) to store with the checkpoint; `set_state(state)` on an iterator over the
    same dataset (same examples and arguments) continues with exactly the batches that would have
    come next.
    """

    def __init__(self, dataset: grain.MapDataset | grain.IterDataset, *, prefetch: int = 8):
        """Starts iterating.

        Args:
            dataset: from `make_dataset`.
            prefetch: batches prepared ahead by one background thread (0: none). One thread
                suffices for in-memory data and avoids GIL contention.
        """
        if isinstance(dataset, grain.MapDataset):
            threads = 1 if prefetch > 0 else 0
            options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)
            dataset = dataset.to_iter_dataset(options)
        self._iterator = iter(dataset)

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> Example:
        return next(self._iterator)

    def get_state(self) -> dict:
        """The position of the iterator, as a JSON-serialisable dict."""
        return dict(self._iterator.get_state())

    def set_state(self, state: Mapping) -> None:
        """Moves the iterator to a position saved by `get_state`.

        Raises:
            ValueError: if `state` does not come from a `BatchIterator` of the same kind.
        """
        expected = set(self._iterator.get_state())
        if set(state) != expected:
            raise ValueError(
                f"Iterator state has keys {sorted(state)}, expected {sorted(expected)}: restore "
                "a state saved by BatchIterator.get_state over the same dataset."
            )
        self._iterator.set_state(dict(state))
