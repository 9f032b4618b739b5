"""Tokenizers: word level (SCAN, algorithmic tasks), character level and SentencePiece.

All three share one interface (`encode(text, add_bos=, add_eos=)`, `decode(ids)`,
`pieces(ids)`, `vocab_size`, `save(path)`, `load(path)`, and the special ids `pad_id`,
`bos_id`, `eos_id`, `unk_id`, which decoding and the decoding tools read from the tokenizer)
and the same special ids. A pretrained checkpoint's own tokenizer
(`tfjax.data.pretrained_tokenizer`) has the same interface with its own special ids. Here ids
0-3 are reserved: PAD (0; padding is still read from segment ids, never from this id), BOS (1;
also the [CLS] token of classification inputs, as in BERT, Devlin et al. 2019, Section 3), EOS
(2) and UNK (3). Word and character ids follow by descending training count, ties broken
alphabetically, so the same texts always give the same vocabulary; those vocabularies are saved
as JSON next to the run, a SentencePiece model as its binary `.model` file (docs/design.md,
"Tokenizers"), so that resumed and evaluated runs reuse them.

A masked-LM run (`model.encoder_head="mlm"`) needs a mask token: `build(..., mask=True)` adds
`MASK_TOKEN` (id 4, right after the specials; SentencePiece: a control symbol, never produced by
`encode`). Without `mask` the vocabularies are exactly what they were; `mask_id` is None then.
"""

import collections
import contextlib
import json
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
from jaxtyping import Integer

from tfjax import errors

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")  # Indexed by the ids above.
MASK_TOKEN = "<mask>"  # masked-LM vocabularies only, at id len(SPECIAL_TOKENS)
SENTENCEPIECE_SAMPLE = 2_000_000  # sentences SentencePiece trains on at most


def _checked(ids: Sequence[int] | Integer[np.ndarray, " L"], vocab_size: int) -> list[int]:
    """`ids` as Python ints; ValueError for one outside [0, vocab_size)."""
    out = [int(token) for token in ids]
    for token in out:
        if not 0 <= token < vocab_size:
            raise ValueError(f"Id {token} is outside the vocabulary [0, {vocab_size}).")
    return out


def content_ids(ids: Sequence[int] | Integer[np.ndarray, " L"], vocab_size: int) -> list[int]:
    """The ids before the first `EOS_ID`, without `PAD_ID` and `BOS_ID`, as Python ints.

    Raises:
        ValueError: for an id outside [0, vocab_size).
    """
    kept = []
    for raw in ids:
        token = int(raw)
        if token == EOS_ID:
            break
        if not 0 <= token < vocab_size:
            raise ValueError(f"Id {token} is outside the vocabulary [0, {vocab_size}).")
        if token not in (PAD_ID, BOS_ID):
            kept.append(token)
    return kept


class WordTokenizer:
    """Maps whitespace-separated words to int ids and back.

    Build one with `WordTokenizer.build(texts)` or `WordTokenizer.load(path)`. Two tokenizers are
    equal when their vocabularies (words in id order) are equal.
    """

    _format = "tfjax.WordTokenizer/1"
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

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
        masked = self._words[len(SPECIAL_TOKENS) : len(SPECIAL_TOKENS) + 1] == (MASK_TOKEN,)
        self.mask_id = len(SPECIAL_TOKENS) if masked else None

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids that are no text: PAD, BOS, EOS, UNK (and the mask)."""
        return (PAD_ID, BOS_ID, EOS_ID, UNK_ID) + ((self.mask_id,) if self.mask_id else ())

    @classmethod
    def build(
        cls, texts: Iterable[str], *, min_count: int = 1, mask: bool = False
    ) -> "WordTokenizer":
        """Builds the vocabulary of `texts`.

        Args:
            texts: training texts; words are separated by whitespace.
            min_count: words seen fewer times are left out (and later encode to `UNK_ID`).
            mask: add `MASK_TOKEN` at id 4 (masked-LM runs).

        Returns:
            A tokenizer whose ids 4, 5, ... (5, 6, ... with `mask`) are the words by descending
            count, then alphabetically.

        Raises:
            ValueError: if `min_count` < 1.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}.")
        counts = collections.Counter(word for text in texts for word in cls._split(text))
        specials = (*SPECIAL_TOKENS, MASK_TOKEN) if mask else SPECIAL_TOKENS
        kept = [w for w, c in counts.items() if c >= min_count and w not in specials]
        kept.sort(key=lambda word: (-counts[word], word))
        return cls([*specials, *kept])

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
        ids = [self._ids.get(word, UNK_ID) for word in self._split(text)]
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
        return self._join([self._words[token] for token in content_ids(ids, self.vocab_size)])

    def pieces(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> list[str]:
        """The token of each id, specials included ("<eos>", ...): labels for plots.

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        return [self._words[token] for token in _checked(ids, self.vocab_size)]

    @staticmethod
    def _split(text: str) -> list[str]:
        return text.split()

    @staticmethod
    def _join(words: list[str]) -> str:
        return " ".join(words)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the vocabulary to `path` as JSON (parent folders must exist)."""
        payload = {"format": self._format, "words": list(self._words)}
        pathlib.Path(path).write_text(json.dumps(payload, indent=0) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordTokenizer":
        """Reads a vocabulary written by `save`.

        Raises:
            FileNotFoundError: if `path` does not exist.
            tfjax.errors.DataError: (a ValueError) naming `path`, if the file is not a saved
                vocabulary: empty, not UTF-8 JSON, another format, no list of words, or words
                that do not start with the specials.
        """
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"No tokenizer file at {path}: build one with {cls.__name__}.build and save it."
            )
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:  # json.JSONDecodeError or UnicodeDecodeError
            what = "empty" if not path.stat().st_size else f"not JSON text ({err})"
            raise errors.DataError(f"{path} is not a saved {cls.__name__}: {what}") from err
        if not isinstance(payload, dict) or payload.get("format") != cls._format:
            raise errors.DataError(
                f"{path} is not a saved {cls.__name__} (expected format {cls._format})."
            )
        words = payload.get("words")
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise errors.DataError(f"{path} is not a saved {cls.__name__}: no list of words")
        try:
            return cls(words)
        except ValueError as err:
            raise errors.DataError(f"{path} is not a saved {cls.__name__}: {err}") from err

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._words == other._words

    def __hash__(self) -> int:
        return hash(self._words)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class CharTokenizer(WordTokenizer):
    """One id per character (newlines and spaces included), as in nanoGPT's shakespeare_char.

    The vocabulary is the specials followed by the characters of the training text by
    descending count, then by code point; `decode` joins characters without separators.
    """

    _format = "tfjax.CharTokenizer/1"

    @staticmethod
    def _split(text: str) -> list[str]:
        return list(text)

    @staticmethod
    def _join(words: list[str]) -> str:
        return "".join(words)


@contextlib.contextmanager
def _explain_trainer_errors(vocab_size: int):
    """Turns SentencePiece's trainer errors into ValueErrors that say what to change."""
    try:
        yield
    except RuntimeError as err:
        raise errors.ConfigError(
            f"SentencePiece could not train a {vocab_size}-piece vocabulary: {err}. Every "
            "character of the training text needs a piece: raise data.vocab_size."
        ) from err


class SentencePieceTokenizer:
    """Subwords from a SentencePiece model (Kudo & Richardson 2018): BPE or unigram.

    Trained with the special ids of this module (PAD 0, BOS 1, EOS 2, UNK 3), every character of
    the training text covered, and no Unicode normalisation, so `decode(encode(text))` gives the
    text back up to runs of whitespace: what BLEU is computed on. Saved as the binary `.model`
    file that the `sentencepiece` tools read.
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, model_proto: bytes):
        """Wraps a serialised SentencePiece model.

        Raises:
            tfjax.errors.DataError: (a ValueError) for an empty model, or special ids that are
                not this module's.
        """
        import sentencepiece

        self._proto = bytes(model_proto)
        if not self._proto:  # sentencepiece would load it, log errors, then fail on every call
            raise errors.DataError("an empty SentencePiece model has no pieces")
        self._sp = sentencepiece.SentencePieceProcessor(model_proto=self._proto)
        specials = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
        mask_id = self._sp.piece_to_id(MASK_TOKEN)
        self.mask_id = mask_id if self._sp.is_control(mask_id) else None
        if specials != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise errors.DataError(
                f"SentencePiece model has special ids (pad, bos, eos, unk) = {specials}, expected "
                f"{(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}: train it with SentencePieceTokenizer.build."
            )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids that are no text: PAD, BOS, EOS, UNK (and the mask)."""
        return (PAD_ID, BOS_ID, EOS_ID, UNK_ID) + ((self.mask_id,) if self.mask_id else ())

    @classmethod
    def build(
        cls, texts: Iterable[str], *, vocab_size: int, model_type: str = "bpe", mask: bool = False
    ) -> "SentencePieceTokenizer":
        """Trains a model on `texts` (one sentence or line each).

        Args:
            texts: training sentences (at most `SENTENCEPIECE_SAMPLE`, sampled, are used).
            vocab_size: the wanted vocabulary size, specials included; a small corpus may give
                fewer pieces (the limit is soft).
            model_type: "bpe" or "unigram".
            mask: add `MASK_TOKEN` as a control symbol (id 4; masked-LM runs).

        Raises:
            ValueError: for an unknown model type, a vocabulary size below 8 or no text.
        """
        import io

        import sentencepiece

        if model_type not in ("bpe", "unigram"):
            raise errors.ConfigError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}.")
        if vocab_size < 8:
            raise errors.ConfigError(f"vocab_size must be >= 8, got {vocab_size}.")
        sentences = [text for text in texts if text.strip()]
        if not sentences:
            raise errors.DataError("Cannot train a SentencePiece model on no text.")
        model = io.BytesIO()
        with open(os.devnull, "w") as quiet, _explain_trainer_errors(vocab_size):
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=1.0,
                normalization_rule_name="identity",
                hard_vocab_limit=False,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                **({"control_symbols": [MASK_TOKEN]} if mask else {}),
                max_sentence_length=1 << 16,
                input_sentence_size=SENTENCEPIECE_SAMPLE,  # large corpora: a random sample
                shuffle_input_sentence=True,
                num_threads=1,  # deterministic and cheap: seconds for Multi30k
                logstream=quiet,
                minloglevel=2,  # the trainer otherwise prints its whole spec to stderr
            )
        return cls(model.getvalue())

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return self._sp.vocab_size()

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Piece ids of `text`, optionally with `BOS_ID` first and `EOS_ID` last."""
        ids = self._sp.encode(text)
        return [BOS_ID] * add_bos + ids + [EOS_ID] * add_eos

    def decode(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> str:
        """Detokenized text of `ids`: stops at the first `EOS_ID`, drops `PAD_ID` and `BOS_ID`.

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        return self._sp.decode(content_ids(ids, self.vocab_size))

    def pieces(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> list[str]:
        """The piece of each id ("▁the", ...), specials as `SPECIAL_TOKENS`: labels for plots.

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        return [
            SPECIAL_TOKENS[token] if token < len(SPECIAL_TOKENS) else self._sp.id_to_piece(token)
            for token in _checked(ids, self.vocab_size)
        ]

    def save(self, path: str | os.PathLike) -> None:
        """Writes the binary model to `path` (parent folders must exist)."""
        pathlib.Path(path).write_bytes(self._proto)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SentencePieceTokenizer":
        """Reads a model written by `save` (or by `spm_train` with the same special ids).

        Raises:
            FileNotFoundError: if `path` does not exist.
            tfjax.errors.DataError: (a ValueError) naming `path`, if the file is not a
                SentencePiece model with this module's ids (empty, cut short, other bytes).
        """
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"No SentencePiece model at {path}: build one with "
                "SentencePieceTokenizer.build and save it."
            )
        try:
            return cls(path.read_bytes())
        except (RuntimeError, IndexError, errors.DataError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise errors.DataError(f"{path} is not a SentencePiece model: {reason}") from err

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SentencePieceTokenizer):
            return NotImplemented
        return self._proto == other._proto

    def __hash__(self) -> int:
        return hash(self._proto)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size})"


from tfjax.data.pretrained_tokenizer import PretrainedTokenizer  # noqa: E402 (imports no tfjax.data)

# CharTokenizer is a WordTokenizer; PretrainedTokenizer wraps a checkpoint's own tokenizer.
Tokenizer = WordTokenizer | SentencePieceTokenizer | PretrainedTokenizer
