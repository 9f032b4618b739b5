"""A pretrained checkpoint's own tokenizer behind tfjax's tokenizer interface.

`PretrainedTokenizer` wraps the Hugging Face tokenizer saved next to a checkpoint (GPT-2's
byte-level BPE, BERT's WordPiece, T5's and Marian's SentencePiece models), loaded with
`transformers.AutoTokenizer` from a local directory (nothing is downloaded). It has the
interface of `tfjax.data.tokenizers` (`encode`, `decode`, `pieces`, `vocab_size`, `save`,
`load` and the special ids), but the special ids are the checkpoint's, not tfjax's 0-3: GPT-2
begins and ends text with the one id of `<|endoftext|>` and has no padding id, BERT's [CLS] and
[SEP] play BOS and EOS, T5 and Marian have no BOS (their decoders start from the padding id,
which the model's `ModelConfig.bos_id` holds). Padding is still read from segment ids, never
from an id. `encode_target` encodes translation targets (Marian's target SentencePiece model).

`transformers` is imported when a tokenizer is loaded (the `hf` extra).
"""

import os
import pathlib
from collections.abc import Sequence

import numpy as np
from jaxtyping import Integer

from tfjax import errors

DIRECTORY = "hf_tokenizer"  # the folder a workdir keeps it in


def _auto_tokenizer(path: pathlib.Path):
    try:
        import transformers
    except ImportError as err:
        raise errors.DependencyError(
            f"{path} holds a Hugging Face tokenizer, which needs the 'hf' extra: "
            'pip install "tfjax[hf]"'
        ) from err
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # a damaged file raises anything from KeyError to AttributeError
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if not isinstance(err, (OSError, ValueError)) or not first:
            first = f"{type(err).__name__}: {first}".rstrip(": ")
        raise errors.DataError(f"no usable Hugging Face tokenizer in {path}: {first}") from err


class PretrainedTokenizer:
    """A Hugging Face tokenizer with tfjax's interface; build it with `load(directory)`.

    Attributes:
        pad_id, bos_id, eos_id, unk_id: the checkpoint's special ids (None where it has none:
            GPT-2 has no padding id, T5 and Marian no BOS). BERT's [CLS] is `bos_id` and its
            [SEP] `eos_id`.
        mask_id: the mask token of masked-LM checkpoints (BERT's [MASK]), else None.
        special_ids: every special id of the tokenizer ([CLS], [SEP], [PAD], [UNK], [MASK], ...).
    """

    def __init__(self, tokenizer):
        """Wraps a loaded `transformers` tokenizer.

        Raises:
            tfjax.errors.DataError: if it has no end-of-sequence id (neither EOS nor [SEP]).
        """
        self._tokenizer = tokenizer
        first = lambda *ids: next((i for i in ids if i is not None), None)  # noqa: E731
        self.eos_id = first(tokenizer.eos_token_id, tokenizer.sep_token_id)
        self.bos_id = first(tokenizer.bos_token_id, tokenizer.cls_token_id)
        self.pad_id = tokenizer.pad_token_id
        self.unk_id = tokenizer.unk_token_id
        self.mask_id = getattr(tokenizer, "mask_token_id", None)
        self.special_ids = tuple(sorted(set(tokenizer.all_special_ids)))
        if self.eos_id is None:
            raise errors.DataError(
                f"the tokenizer {type(tokenizer).__name__} has no end-of-sequence token (eos or "
                "sep): tfjax ends every sequence with one"
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's table may have more rows)."""
        return len(self._tokenizer)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of `text` without the tokenizer's own specials; BOS / EOS only where asked.

        Raises:
            tfjax.errors.DataError: for `add_bos` with a tokenizer that has no BOS.
        """
        if add_bos and self.bos_id is None:
            raise errors.DataError(
                f"{type(self._tokenizer).__name__} has no BOS (or [CLS]) token to prepend"
            )
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return [self.bos_id] * add_bos + list(ids) + [self.eos_id] * add_eos

    def encode_target(self, text: str, *, add_eos: bool = False) -> list[int]:
        """Ids of a target text: `encode`, but through the tokenizer's target side where it has
        one (Marian keeps a SentencePiece model per language, `text_target`); others encode
        targets as sources."""
        ids = self._tokenizer(text_target=text, add_special_tokens=False)["input_ids"]
        return list(ids) + [self.eos_id] * add_eos

    def decode(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> str:
        """Text of `ids` up to the first EOS, without special tokens.

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        kept = []
        for raw in ids:
            token = int(raw)
            if token == self.eos_id:
                break
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"Id {token} is outside the vocabulary [0, {self.vocab_size}).")
            kept.append(token)
        return self._tokenizer.decode(kept, skip_special_tokens=True)

    def pieces(self, ids: Sequence[int] | Integer[np.ndarray, " L"]) -> list[str]:
        """The token of each id, specials included ("<|endoftext|>", "[CLS]", ...): labels.

        Raises:
            ValueError: for an id outside [0, vocab_size).
        """
        checked = [int(token) for token in ids]
        for token in checked:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"Id {token} is outside the vocabulary [0, {self.vocab_size}).")
        return list(self._tokenizer.convert_ids_to_tokens(checked))

    def save(self, path: str | os.PathLike) -> None:
        """Writes the tokenizer's files into the directory `path` (created if needed)."""
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        self._tokenizer.save_pretrained(str(path))

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """`save`, under the name `transformers` uses (export writes it next to the weights)."""
        self.save(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PretrainedTokenizer":
        """Reads the tokenizer saved in the directory `path` (by `save` or `save_pretrained`).

        Raises:
            FileNotFoundError: if `path` is not a directory.
            tfjax.errors.DependencyError: without `transformers`.
            tfjax.errors.DataError: if `path` holds no tokenizer `transformers` can load.
        """
        path = pathlib.Path(path)
        if not path.is_dir():
            raise FileNotFoundError(
                f"no tokenizer directory {path}: python -m experiments.convert writes one"
            )
        return cls(_auto_tokenizer(path))

    def __repr__(self) -> str:
        name = type(self._tokenizer).__name__
        return f"PretrainedTokenizer({name}, vocab_size={self.vocab_size})"
