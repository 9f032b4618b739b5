"""The tokenizer a workdir keeps: where it lives, its SHA-256, and reading it back checked.

A run builds its tokenizer from the training split once and saves it in its workdir
(`tokenizer.json` for word and character vocabularies, `tokenizer.model` for SentencePiece,
the directory `hf_tokenizer/` for a converted checkpoint's own); every later command reads it
back. Checkpoints trained with it mean nothing with another: token ids index their embedding
rows. So `load` refuses, in one `tfjax.errors.DataError` that names the file and the fix, a
tokenizer that is damaged, one that is missing where checkpoints were trained with it, and one
whose SHA-256 (`sha256`) is not the one the workdir recorded when it was made (the runs layer
keeps that in `config.json`, `tfjax.runs.workdir_format`). It never builds a tokenizer in place of a
missing one: built again from data that changed since, it would give other ids, silently.
"""

import hashlib
import pathlib

import numpy as np

from tfjax import errors
from tfjax.data import corpora, pretrained_tokenizer, tokenizers

TOKENIZER_FILE = "tokenizer.json"  # word and char vocabularies
SENTENCEPIECE_FILE = "tokenizer.model"
DIRECTORY = pretrained_tokenizer.DIRECTORY  # a pretrained checkpoint's tokenizer files
KINDS = {
    "word": tokenizers.WordTokenizer,
    "char": tokenizers.CharTokenizer,
    "sentencepiece": tokenizers.SentencePieceTokenizer,
    "pretrained": tokenizers.PretrainedTokenizer,
}


def name(kind: str) -> str:
    """The name of a saved tokenizer of `kind` (`data.tokenizer`) in a workdir."""
    return {"pretrained": DIRECTORY, "sentencepiece": SENTENCEPIECE_FILE}.get(kind, TOKENIZER_FILE)


def path(kind: str, workdir: str | pathlib.Path) -> pathlib.Path:
    """Where `workdir` keeps a tokenizer of `kind`; a directory for "pretrained"."""
    return pathlib.Path(workdir) / name(kind)


def sha256(location: pathlib.Path) -> str | None:
    """SHA-256 (hex) of a saved tokenizer, None if there is none.

    A file's is that of its bytes (what `sha256sum` prints); a directory's is that of its
    files' relative paths and SHA-256s, in sorted order.
    """
    if location.is_file():
        return corpora.sha256(location)
    if not location.is_dir():
        return None
    total = hashlib.sha256()
    for file in sorted(p for p in location.rglob("*") if p.is_file()):
        total.update(f"{file.relative_to(location).as_posix()}\0".encode())
        total.update(bytes.fromhex(corpora.sha256(file)))
    return total.hexdigest()


def load(
    kind: str, workdir: str | pathlib.Path, *, trained: bool, expected_sha256: str | None
) -> tokenizers.Tokenizer | None:
    """The tokenizer `workdir` keeps, checked; None when it has none and may build one.

    Args:
        kind: `data.tokenizer` ("word", "char", "sentencepiece" or "pretrained").
        workdir: the run's directory.
        trained: the workdir holds checkpoints trained with its tokenizer: it must be there.
        expected_sha256: the SHA-256 the workdir recorded for it (None: not recorded, as in
            workdirs made before tfjax recorded it; the tokenizer found is taken).

    Raises:
        tfjax.errors.DataError: naming the file and the fix, for a damaged tokenizer, a missing
            one when `trained`, or one whose SHA-256 is not `expected_sha256`.
    """
    location = path(kind, workdir)
    present = location.is_dir() if kind == "pretrained" else location.exists()
    if not present:
        if trained:
            raise errors.DataError(
                f"{location} is missing, but the checkpoints in {workdir} were trained with it: "
                f"{_put_back(kind, expected_sha256)}"
            )
        return None
    try:
        tokenizer = KINDS[kind].load(location)
    except (errors.DataError, FileNotFoundError) as err:  # FileNotFoundError: a directory
        fix = _put_back(kind, expected_sha256) if trained else _start_afresh(kind, location)
        raise errors.DataError(f"the workdir's tokenizer is damaged: {err}; {fix}") from err
    actual = sha256(location)
    if expected_sha256 is not None and actual != expected_sha256:
        raise errors.DataError(
            f"{location} is not the tokenizer the checkpoints in {workdir} were trained with: "
            f"its SHA-256 is {actual}, config.json records {expected_sha256}; "
            f"{_put_back(kind, expected_sha256, check=False)}"
        )
    return tokenizer


def _put_back(kind: str, expected_sha256: str | None, *, check: bool = True) -> str:
    """The fix for a missing, damaged or different tokenizer that checkpoints depend on."""
    where = (
        "copy the tokenizer files of the Hugging Face checkpoint the workdir was converted "
        "from into it"
        if kind == "pretrained"
        else "put the original back, from a backup or a copy of this workdir"
    )
    recorded = check and expected_sha256 is not None
    digest = f" (SHA-256 {expected_sha256}, as config.json records)" if recorded else ""
    return (
        f"{where}{digest}. It is not built again from the data: if the data changed since, a "
        "new tokenizer would give the checkpoints other ids"
    )


def _start_afresh(kind: str, location: pathlib.Path) -> str:
    """The fix for a damaged tokenizer no checkpoint depends on."""
    if kind == "pretrained":
        return (
            f"copy the tokenizer files of the Hugging Face checkpoint into {location} (python "
            "-m experiments.convert writes them)"
        )
    return f"no checkpoint depends on it yet: delete {location} and rerun to build a new one"


def unknown_tokens(tokens: np.ndarray | list[dict], unk_id: int) -> int:
    """How many tokens are `unk_id`: of a text stream's ids [n] (each token once, however
    its training windows overlap), or of the scored tokens of `examples` (inputs and targets
    where their weights, else segment ids, are > 0; rows of one shape per field)."""
    if isinstance(tokens, np.ndarray):
        return int(np.count_nonzero(tokens == unk_id))
    count = 0
    for key in ("inputs", "targets"):
        if tokens and key in tokens[0]:
            scored = f"{key}_weights" if f"{key}_weights" in tokens[0] else f"{key}_segment_ids"
            ids = np.stack([example[key] for example in tokens])  # [N, L]
            weights = np.stack([example[scored] for example in tokens])  # [N, L]
            count += int(np.count_nonzero((ids == unk_id) & (weights > 0)))
    return count
