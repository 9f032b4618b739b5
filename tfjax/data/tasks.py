"""Algorithmic toy tasks, generated deterministically from a seed.

Sequence-to-sequence tasks over symbols "s0" ... "s{num_symbols-1}": copy, reverse and sort (the
classic probes of Graves et al., "Neural Turing Machines", 2014, and of the Transformer
literature's small-scale sanity checks; a decoder-only model reads each pair as one
"source | target" string, `LM_SEPARATOR` between, joined by `tfjax.data.datasets`); and two
binary classification tasks over "0"/"1" strings, parity and majority (studied for
Transformers by Hahn, "Theoretical Limitations of Self-Attention in Neural Sequence Models",
TACL 2020).

All sequences are space-separated strings. Lengths are drawn uniformly from [min_len, max_len];
every generator uses its own `np.random.default_rng(seed)`, so copy, reverse and sort with the same
arguments share their source sequences.
"""

import numpy as np

from tfjax import errors

SEQ2SEQ_TASKS = ("copy", "reverse", "sort")
CLASSIFICATION_TASKS = ("parity", "majority")
LM_SEPARATOR = "|"


def _check_lengths(num_examples: int, min_len: int, max_len: int) -> None:
    if num_examples < 0:
        raise errors.ConfigError(f"num_examples must be >= 0, got {num_examples}.")
    if min_len < 1 or max_len < min_len:
        raise errors.ConfigError(
            f"Need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}: "
            "raise max_len or lower min_len."
        )


def _random_sequences(
    num_examples: int, min_len: int, max_len: int, num_symbols: int, seed: int
) -> list[np.ndarray]:
    """`num_examples` int64 arrays of symbol indices in [0, num_symbols)."""
    _check_lengths(num_examples, min_len, max_len)
    if num_symbols < 1:
        raise errors.ConfigError(f"num_symbols must be >= 1, got {num_symbols}.")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=num_examples)
    return [rng.integers(0, num_symbols, size=length) for length in lengths]


def _to_text(indices: np.ndarray) -> str:
    return " ".join(f"s{i}" for i in indices)


def _check_name(name: str, allowed: tuple[str, ...]) -> None:
    if name not in allowed:
        raise errors.ConfigError(f"Unknown task {name!r}: choose one of {', '.join(allowed)}.")


def solve(name: str, source: str) -> str:
    """The target of a sequence-to-sequence task for `source`, e.g. for scoring model outputs.

    Args:
        name: "copy", "reverse" or "sort".
        source: space-separated symbols "s<number>", e.g. "s10 s2 s9".

    Returns:
        The target, e.g. "s9 s2 s10" for "reverse" and "s2 s9 s10" for "sort" (by number).

    Raises:
        ValueError: for an unknown `name`.
    """
    _check_name(name, SEQ2SEQ_TASKS)
    words = source.split()
    if name == "reverse":
        words = words[::-1]
    elif name == "sort":
        words = sorted(words, key=lambda word: int(word.removeprefix("s")))
    return " ".join(words)


def _seq2seq(
    name: str, num_examples: int, min_len: int, max_len: int, num_symbols: int, seed: int
) -> list[tuple[str, str]]:
    _check_name(name, SEQ2SEQ_TASKS)
    sources = _random_sequences(num_examples, min_len, max_len, num_symbols, seed)
    return [(_to_text(source), solve(name, _to_text(source))) for source in sources]


def copy_task(
    num_examples: int, *, min_len: int = 1, max_len: int = 10, num_symbols: int = 10, seed: int = 0
) -> list[tuple[str, str]]:
    """Copy: the target equals the source, e.g. ("s3 s1 s7", "s3 s1 s7").

    Args:
        num_examples: number of pairs.
        min_len: shortest source, in symbols (>= 1).
        max_len: longest source, in symbols (>= min_len).
        num_symbols: alphabet size; symbols are "s0" ... "s{num_symbols-1}".
        seed: seeds the generator; equal arguments give equal pairs.

    Returns:
        `num_examples` (source, target) pairs of space-separated symbols.

    Raises:
        ValueError: for negative counts, empty length ranges or an empty alphabet.
    """
    return _seq2seq("copy", num_examples, min_len, max_len, num_symbols, seed)


def reverse_task(
    num_examples: int, *, min_len: int = 1, max_len: int = 10, num_symbols: int = 10, seed: int = 0
) -> list[tuple[str, str]]:
    """Reverse: the target is the source backwards, e.g. ("s3 s1 s7", "s7 s1 s3").

    Arguments, return value and errors as in `copy_task`.
    """
    return _seq2seq("reverse", num_examples, min_len, max_len, num_symbols, seed)


def sort_task(
    num_examples: int, *, min_len: int = 1, max_len: int = 10, num_symbols: int = 10, seed: int = 0
) -> list[tuple[str, str]]:
    """Sort: the target is the source in ascending symbol index, e.g. ("s3 s1 s7", "s1 s3 s7").

    Symbols sort by their number, so "s2" comes before "s10". Arguments, return value and errors
    as in `copy_task`.
    """
    return _seq2seq("sort", num_examples, min_len, max_len, num_symbols, seed)


def classification_task(
    name: str, num_examples: int, *, min_len: int = 1, max_len: int = 10, seed: int = 0
) -> list[tuple[str, int]]:
    """Binary classification of random "0"/"1" strings.

    "parity": label = number of "1" symbols modulo 2. "majority": label 1 iff the string has more
    "1" than "0"; lengths are drawn uniformly from the odd numbers in [min_len, max_len] so ties
    cannot happen.

    Args:
        name: "parity" or "majority".
        num_examples: number of examples.
        min_len: shortest string (>= 1).
        max_len: longest string (>= min_len; for "majority" the range must hold an odd number).
        seed: seeds the generator.

    Returns:
        `num_examples` (text, label) pairs, e.g. ("1 0 1", 0) for parity.

    Raises:
        ValueError: for an unknown `name` or invalid lengths.
    """
    _check_name(name, CLASSIFICATION_TASKS)
    _check_lengths(num_examples, min_len, max_len)
    # Odd lengths only for majority: an even-length string can tie.
    step = 2 if name == "majority" else 1
    first = min_len + (1 - min_len % 2) if name == "majority" else min_len
    choices = np.arange(first, max_len + 1, step)
    if choices.size == 0:
        raise errors.ConfigError(
            f"majority needs an odd length in [{min_len}, {max_len}]: widen the range."
        )
    rng = np.random.default_rng(seed)
    lengths = rng.choice(choices, size=num_examples)
    examples = []
    for length in lengths:
        bits = rng.integers(0, 2, size=length)
        ones = int(bits.sum())
        label = ones % 2 if name == "parity" else int(2 * ones > length)
        examples.append((" ".join(str(b) for b in bits), label))
    return examples
