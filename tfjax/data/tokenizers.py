"""Word-level tokenizer for small, whitespace-tokenized tasks (SCAN, algorithmic tasks).

Ids 0-3 are reserved: PAD (0; padding is still read from segment ids, never from this id), BOS
(1; also the [CLS] token of classification inputs, as in BERT, Devlin et al. 2019, Section 3),
EOS (2) and UNK (3). The remaining ids are words ordered by descending training count, ties broken
alphabetically, so the same texts always give the same vocabulary. The vocabulary is saved as
JSON next to the run (see DESIGN.md, "Tokenizers") so that resumed runs reuse it.
"""

import collections
import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
from jaxtyping import Integer

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # Indexed by the ids above.

_FORMAT = "tfjax.WordTokenizer/1"


class WordTokenizer:
    """Maps whitespace-separated words to int ids and back.

    Build one with `WordTokenizer.build(texts)` or `WordTokenizer.load(path)`. Two tokenizers are
    equal when their vocabularies (words in id order) are equal.
    """

    def __init__(self, words: Iterable[str]):
        """Wraps a vocabulary.

        Args:
            words: all tokens in id order, starting with `SPECIAL_TOKENS`.

        Raises:
            ValueError: if the specials are missing or misplaced, or a word repeats.
        """
        self._words = tuple(words)
        if self._words[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise ValueError(
                f"A vocabulary must start with {SPECIAL_TOKENS}, got {self._words[:4]}: "
                "build it with WordTokenizer.build."
            )
        self._ids = {word: i for i, word in enumerate(self._words)}
        if len(self._ids) != len(self._words):
            raise ValueError("The vocabulary repeats a word: every word needs exactly one id.")

    @classmethod
    def build(cls, texts: Iterable[str], *, min_count: int = 1) -> "WordTokenizer":
        """Builds the vocabulary of `texts`.

        Args:
            texts: training texts; words are separated by whitespace.
            min_count: words seen fewer times are left out (and later encode to `UNK_ID`).

        Returns:
            A tokenizer whose ids 4, 5, ... are the words by descending count, then alphabetically.

        Raises:
            ValueError: if `min_count` < 1.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}.")
        counts = collections.Counter(word for text in texts for word in text.split())
        kept = [w for w, c in counts.items() if c >= min_count and w not in SPECIAL_TOKENS]
        kept.sort(key=lambda word: (-counts[word], word))
        return cls([*SPECIAL_TOKENS, *kept])

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return len(self._words)

    @property
    def words(self) -> tuple[str, ...]:
        """The vocabulary in id order."""
        return self._words

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of the words of `text`; unknown words become `UNK_ID`.

        Args:
            text: whitespace-separated words.
            add_bos: prepend `BOS_ID`.
            add_eos: append `EOS_ID`.

        Returns:
            The ids, as Python ints.
        """
        ids = [self._ids.get(word, UNK_ID) for word in text.split()]
        return [BOS_ID] * add_bos + ids + [EOS_ID] * add_eos

    # The leading space in " L" stops pyflakes from reading L as a name (jaxtyping FAQ).
    def decode(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> str:
        """Text of `ids`: stops at the first `EOS_ID` and drops `PAD_ID` and `BOS_ID`.

        Args:
            ids: [L] token ids, a list or an integer array.

        Returns:
            The words joined by single spaces; `UNK_ID` decodes to "<unk>".

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        words = []
        for raw in ids:
            token = int(raw)
            if token == EOS_ID:
                break
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"Id {token} is outside the vocabulary [0, {self.vocab_size}).")
            if token not in (PAD_ID, BOS_ID):
                words.append(self._words[token])
        return " ".join(words)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the vocabulary to `path` as JSON (parent folders must exist)."""
        payload = {"format": _FORMAT, "words": list(self._words)}
        pathlib.Path(path).write_text(json.dumps(payload, indent=0) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordTokenizer":
        """Reads a vocabulary written by `save`.

        Raises:
            FileNotFoundError: if `path` does not exist.
            ValueError: if the file is not a saved WordTokenizer.
        """
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"No tokenizer file at {path}: build one with WordTokenizer.build and save it."
            )
        payload = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a saved WordTokenizer (expected format {_FORMAT}).")
        return cls(payload["words"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WordTokenizer):
            return NotImplemented
        return self._words == other._words

    def __hash__(self) -> int:
        return hash(self._words)

    def __repr__(self) -> str:
        return f"WordTokenizer(vocab_size={self.vocab_size})"
