"""Raw text from files, named local corpora and online hubs, with errors that name file and line.

Everything here returns plain Python strings; tokenizing and batching happen in `datasets` and
`pipeline`. Readers:
  * `read_lines`: UTF-8 lines of one file (no trailing newline; "\\r\\n" accepted);
  * `read_parallel`: line-aligned source/target files (`train.en` / `train.de`) or a TSV file
    with source and target columns;
  * `read_classification`: a TSV file of (text, integer label) rows;
  * `read_text`: a whole file as one string (language modelling).
Named corpora read from the data directory (`data_dir`: `data.dir`, else $TFJAX_DATA_DIR, else a
per-user cache) and are verified against the SHA-256 sums tfjax ships (`tfjax.data.corpora`);
a missing one is an error that names the command fetching it (`python -m experiments.data`):
  * `multi30k`: Multi30k Task 1 (Elliott et al. 2016), En-De in either direction; splits
    train (29,000), val (1,014), test2016 (1,000, the reference sacreBLEU uses);
  * `tinyshakespeare`: Karpathy's 1,115,394 characters, split 90/10 as nanoGPT does
    (train 1,003,854 characters, val 111,540).
`hub_pairs` reads translation pairs through Hugging Face `datasets` (the `hub` extra, imported on
first use), e.g. WMT14 De-En; given a builder like "json" and local files it reads those instead,
which is how it is tested offline.
"""

import os
import pathlib
from collections.abc import Sequence

from tfjax import errors
from tfjax.data import corpora

DATA_DIR_ENV = "TFJAX_DATA_DIR"
MULTI30K_SPLITS = ("train", "val", "test2016")
MULTI30K_LANGS = ("en", "de")
SHAKESPEARE_SPLITS = ("train", "val")
SHAKESPEARE_TRAIN_FRACTION = 0.9  # nanoGPT's data/shakespeare_char/prepare.py


def data_dir(configured: str = "") -> pathlib.Path:
    """The data directory of the named corpora; it need not exist yet.

    `configured` (`data.dir`) if given, else $TFJAX_DATA_DIR, else a per-user cache:
    $XDG_CACHE_HOME/tfjax/data (when XDG_CACHE_HOME is an absolute path), else
    ~/.cache/tfjax/data. `python -m experiments.data` fetches corpora into the same folder.
    """
    chosen = configured or os.environ.get(DATA_DIR_ENV, "")
    if chosen:
        return pathlib.Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(cache) if os.path.isabs(cache) else pathlib.Path.home() / ".cache"
    return base / "tfjax" / "data"


def check_corpus(root: str | os.PathLike, name: str, files: Sequence[str]) -> None:
    """Checks that `files` of corpus `name` are under `root` and match the shipped sums.

    Raises:
        FileNotFoundError: if a file is missing: the message names the command that fetches
            the corpus into `root` (`--data_dir` only where `root` is not the default).
        tfjax.errors.DataError: if a file's SHA-256 differs from the shipped one.
    """
    root = pathlib.Path(root)
    default = root.resolve() == data_dir().resolve()
    command = corpora.fetch_command(name, None if default else root)
    absent = [f for f in files if not (root / f).is_file()]
    if absent:
        raise FileNotFoundError(
            f"corpus {name} is not in the data directory {root} ({absent[0]} is missing); "
            f"point data.dir or ${DATA_DIR_ENV} at a folder that holds it, or fetch it with: "
            f"{command}"
        )
    corpora.verify(root, files, fix=f"fetch it again with: {command}")


def _read_bytes(path: str | os.PathLike) -> bytes:
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; check the data paths in the config")
    return path.read_bytes()


def decode_utf8(raw: bytes, name: str | os.PathLike) -> str:
    """`raw` decoded as UTF-8; `name` (a path, or e.g. "<stdin>") is named in the error.

    Raises:
        tfjax.errors.DataError: `name:line: byte 0x.. at column N is not UTF-8` for the first
            undecodable byte (line and column 1-based), with how to re-encode the text.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise errors.DataError(
            f"{name}:{line}: byte {raw[err.start]:#04x} at column {column} is not UTF-8; "
            "re-encode the text as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def read_text(path: str | os.PathLike) -> str:
    """The whole UTF-8 file as one string.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: for undecodable bytes (file, line and column named) or an empty file.
    """
    text = decode_utf8(_read_bytes(path), path)
    if not text.strip():
        raise errors.DataError(f"{path} is empty: a split needs at least one example")
    return text


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 file, without line endings ("\\n" or "\\r\\n").

    Raises:
        FileNotFoundError, ValueError: as `read_text`.
    """
    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.removesuffix("\r") for line in lines]


def _split_tsv(lines: Sequence[str], path, columns: int) -> list[list[str]]:
    rows = []
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != columns:
            raise errors.DataError(
                f"{path}:{number}: expected {columns} tab-separated columns, found "
                f"{len(fields)}: {line[:80]!r}"
            )
        rows.append(fields)
    return rows


def read_parallel(source_path: str | os.PathLike, target_path: str | os.PathLike | None = None):
    """(source, target) pairs from two line-aligned files, or from one two-column TSV file.

    Args:
        source_path: the source-language file, or a TSV file when `target_path` is None.
        target_path: the target-language file, line i translating line i of `source_path`.

    Returns:
        A list of (source, target) strings.

    Raises:
        FileNotFoundError: for a missing file.
        ValueError: for mismatched line counts (both files and counts named), a TSV line
            without exactly two columns, undecodable bytes or an empty file.
    """
    if target_path is None:
        return [tuple(row) for row in _split_tsv(read_lines(source_path), source_path, 2)]
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise errors.DataError(
            f"parallel files differ in length: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}; line i of one must translate line i of the other"
        )
    return list(zip(sources, targets, strict=True))


def read_classification(path: str | os.PathLike) -> list[tuple[str, int]]:
    """(text, label) rows of a TSV file whose second column is an integer label >= 0.

    Raises:
        FileNotFoundError, ValueError: as `read_parallel`, and for a label that is not an
            integer >= 0 (line named).
    """
    examples = []
    for number, (text, label) in enumerate(_split_tsv(read_lines(path), path, 2), start=1):
        if not label.strip().isdigit():
            raise errors.DataError(f"{path}:{number}: label {label!r} is not an integer >= 0")
        examples.append((text, int(label)))
    return examples


def multi30k(
    root: str | os.PathLike, split: str, *, source_lang: str = "en", target_lang: str = "de"
) -> list[tuple[str, str]]:
    """Multi30k (Task 1) pairs of `split`, verified against the shipped sums.

    Raises:
        ValueError: for an unknown split or language pair, or a checksum mismatch.
        FileNotFoundError: for missing files.
    """
    if split not in MULTI30K_SPLITS:
        raise errors.ConfigError(f"multi30k has splits {MULTI30K_SPLITS}, not {split!r}")
    if {source_lang, target_lang} != set(MULTI30K_LANGS):
        raise errors.ConfigError(
            f"multi30k translates between {MULTI30K_LANGS}: got source_lang={source_lang!r}, "
            f"target_lang={target_lang!r}"
        )
    names = [f"multi30k/{split}.{lang}" for lang in (source_lang, target_lang)]
    check_corpus(root, "multi30k", names)
    return read_parallel(pathlib.Path(root) / names[0], pathlib.Path(root) / names[1])


def split_text(text: str, split: str, train_fraction: float) -> str:
    """The first `train_fraction` of the characters ("train") or the rest ("val")."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if split not in SHAKESPEARE_SPLITS:
        raise errors.ConfigError(f"a text file splits into {SHAKESPEARE_SPLITS}, not {split!r}")
    cut = int(train_fraction * len(text))
    return text[:cut] if split == "train" else text[cut:]


def tinyshakespeare(root: str | os.PathLike, split: str) -> str:
    """Split `split` ("train" or "val") of Tiny Shakespeare, verified against the shipped sum."""
    name = "tinyshakespeare/input.txt"
    check_corpus(root, "tinyshakespeare", [name])
    return split_text(read_text(pathlib.Path(root) / name), split, SHAKESPEARE_TRAIN_FRACTION)


def hub_pairs(
    name: str,
    split: str,
    *,
    config: str = "",
    source_lang: str,
    target_lang: str,
    data_files: str | None = None,
) -> list[tuple[str, str]]:
    """Translation pairs of a Hugging Face dataset with a `translation` column.

    Args:
        name: a hub dataset ("wmt14") or a local builder ("json", "parquet").
        split: the split to read ("train", "validation", "test").
        config: the dataset configuration ("de-en" for WMT14).
        source_lang, target_lang: keys of the `translation` dicts.
        data_files: local files for a builder such as "json" (tests use this: no network).

    Raises:
        ImportError: if `datasets` is not installed (install the `hub` extra).
        ValueError: if the records hold no `translation` column with both languages.
    """
    try:
        import datasets as hf_datasets
    except ImportError as err:
        raise errors.DependencyError(
            "data.name='hub' needs Hugging Face datasets: pip install 'tfjax[hub]'"
        ) from err
    kwargs = {"data_files": {split: data_files}} if data_files else {}
    table = hf_datasets.load_dataset(name, config or None, split=split, **kwargs)
    if "translation" not in table.column_names:
        raise errors.DataError(
            f"{name} split {split} has columns {table.column_names}, not 'translation': "
            "hub data must hold translation pairs"
        )
    pairs = []
    for number, record in enumerate(table["translation"], start=1):
        if source_lang not in record or target_lang not in record:
            raise errors.DataError(
                f"{name} {split} record {number} has languages {sorted(record)}, "
                f"not {source_lang!r} and {target_lang!r}"
            )
        pairs.append((record[source_lang], record[target_lang]))
    return pairs
