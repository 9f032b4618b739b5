"""Packing: several short examples per row, told apart by segment ids 1, 2, ... and positions.

Padding wastes most of a batch when lengths vary (SCAN targets average 15 of 49 tokens). A
packed row holds examples back to back; the model keeps them apart with the segment masks and
restarts positions per segment (`tfjax.nn.masking.segment_mask`, `models.shift_right`), so a packed
row computes exactly what the separate rows would (tested in tests/test_models.py). Packing as
in T5 (Raffel et al. 2020, §3.1.2 footnote on packing) and Flax's `examples/wmt`.

Rows are filled first-fit over a window of open rows, in a seeded random order, so packing is
deterministic from the seed and the examples of a row differ from one seed to another.
"""

from collections.abc import Mapping, Sequence

import numpy as np

Example = dict[str, np.ndarray]


def _fields(example: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The token fields of an example: "inputs" and/or "targets"."""
    return tuple(k for k in ("inputs", "targets") if k in example)


def _length(example: Mapping[str, np.ndarray], field: str) -> int:
    return int(np.count_nonzero(example[f"{field}_segment_ids"]))


class _Row:
    """One packed row being filled: lists of token ids per field and the segment count."""

    def __init__(self, fields: tuple[str, ...]):
        self.tokens = {f: [] for f in fields}
        self.segments = 0

    def fits(self, lengths: Mapping[str, int], capacity: Mapping[str, int]) -> bool:
        return all(len(self.tokens[f]) + n <= capacity[f] for f, n in lengths.items())

    def add(self, example: Mapping[str, np.ndarray], lengths: Mapping[str, int]) -> None:
        self.segments += 1
        for field, n in lengths.items():
            self.tokens[field].extend(example[field][:n].tolist())

    def to_example(
        self, lengths_of_segments: list[dict[str, int]], capacity: Mapping[str, int]
    ) -> Example:
        out = {}
        for field, tokens in self.tokens.items():
            size = capacity[field]
            ids = np.zeros(size, np.int32)
            ids[: len(tokens)] = tokens
            seg, pos, start = np.zeros(size, np.int32), np.zeros(size, np.int32), 0
            for segment, lengths in enumerate(lengths_of_segments, start=1):
                n = lengths[field]
                seg[start : start + n] = segment
                pos[start : start + n] = np.arange(n)
                start += n
            out[field], out[f"{field}_segment_ids"], out[f"{field}_positions"] = ids, seg, pos
        return out


def pack(
    examples: Sequence[Mapping[str, np.ndarray]],
    capacity: Mapping[str, int],
    *,
    seed: int,
    window: int = 16,
) -> list[Example]:
    """Packs padded examples (segment id 1 = token, 0 = padding) into rows of `capacity`.

    Args:
      examples: seq2seq or lm examples from `tfjax.data.pipeline.encode_*`.
      capacity: packed row length per field, e.g. {"inputs": 40, "targets": 50}; every
        example must fit a row on its own.
      seed: order in which examples are placed.
      window: how many rows stay open for first-fit placement.

    Returns:
      Packed examples with `<field>`, `<field>_segment_ids` (1, 2, ... per example, 0 =
      padding) and `<field>_positions` (restarting at 0 in each segment), int32.

    Raises:
      ValueError: if an example is longer than the row capacity of one of its fields.
    """
    if not examples:
        return []
    fields = _fields(examples[0])
    order = np.random.default_rng(seed).permutation(len(examples))
    open_rows: list[tuple[_Row, list]] = []
    done: list[Example] = []
    for index in order:
        example = examples[index]
        lengths = {f: _length(example, f) for f in fields}
        too_long = {f: n for f, n in lengths.items() if n > capacity[f]}
        if too_long:
            raise ValueError(
                f"example {index} has lengths {too_long} above the packed row "
                f"capacity {dict(capacity)}: raise the packed lengths"
            )
        row = next((r for r in open_rows if r[0].fits(lengths, capacity)), None)
        if row is None:
            if len(open_rows) == window:
                oldest, segs = open_rows.pop(0)
                done.append(oldest.to_example(segs, capacity))
            row = (_Row(fields), [])
            open_rows.append(row)
        row[0].add(example, lengths)
        row[1].append(lengths)
    done.extend(r.to_example(segs, capacity) for r, segs in open_rows)
    return done
