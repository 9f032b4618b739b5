"""The named corpora: where each comes from, its license and citation, and the SHA-256 sums of
its files, shipped with tfjax.

A named corpus (`data.name=multi30k`, `data.name=tinyshakespeare`) lives in the data directory
(`tfjax.data.sources.data_dir`) in this layout:

    multi30k/train.en  multi30k/train.de  multi30k/val.en  multi30k/val.de
    multi30k/test2016.en  multi30k/test2016.de
    tinyshakespeare/input.txt

Each file is byte for byte a file of the corpus's upstream repository at a pinned commit
(gunzipped where upstream keeps it gzipped), and `SHA256` holds its sum. The sums come with the
package, so a corpus is checked against what its pinned source holds, not against a list that
came with the files. `tfjax.data.sources` verifies a corpus here before reading it;
`tfjax.data.fetch` downloads or lays out one (`python -m experiments.data`).
"""

import dataclasses
import functools
import hashlib
import os
import pathlib
import shlex
from collections.abc import Sequence

from tfjax import errors

GITHUB_RAW = "https://raw.githubusercontent.com"  # + /<owner>/<repo>/<commit>/<path>
FETCH_MODULE = "experiments.data"

# The SHA-256 of every file of the named corpora, by its path under the data directory.
SHA256 = {
    "multi30k/train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "multi30k/train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "multi30k/val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "multi30k/val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "multi30k/test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "multi30k/test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "tinyshakespeare/input.txt": (
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    ),
}


@dataclasses.dataclass(frozen=True)
class File:
    """One file of a corpus.

    Attributes:
      name: its path under the data directory, e.g. "multi30k/test2016.en".
      upstream: its path in the upstream repository at the pinned commit, e.g.
        "data/task1/raw/test_2016_flickr.en.gz"; gzipped upstream when it ends in ".gz".
    """

    name: str
    upstream: str

    @property
    def gzipped(self) -> bool:
        return self.upstream.endswith(".gz")


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A named corpus: its files and where they come from.

    Attributes:
      name: the `data.name` that reads it, and the folder under the data directory.
      title: what it is, in a few words.
      repository: the upstream GitHub repository, "owner/name".
      commit: the pinned upstream commit the files are taken from.
      files: its files, in the order they are fetched.
      license: the terms of use, as the upstream repository states them.
      citation: what to cite.
    """

    name: str
    title: str
    repository: str
    commit: str
    files: tuple[File, ...]
    license: str
    citation: str

    def url(self, file: File, base: str = GITHUB_RAW) -> str:
        """The URL of `file` at the pinned commit: `base/<owner>/<repo>/<commit>/<path>`."""
        return f"{base.rstrip('/')}/{self.repository}/{self.commit}/{file.upstream}"

    def names(self) -> list[str]:
        """The paths of its files under the data directory."""
        return [file.name for file in self.files]


def _multi30k_files() -> tuple[File, ...]:
    upstream = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
    return tuple(
        File(f"multi30k/{split}.{lang}", f"data/task1/raw/{upstream[split]}.{lang}.gz")
        for split in upstream
        for lang in ("en", "de")
    )


CORPORA = {
    corpus.name: corpus
    for corpus in (
        Corpus(
            name="multi30k",
            title="Multi30k Task 1, English-German image descriptions",
            repository="multi30k/dataset",
            commit="a3d2e0d26b56f3846f66a952536ffed4e401d05a",
            files=_multi30k_files(),
            license="non-commercial research and education only (the repository's README)",
            citation=(
                "Elliott, Frank, Sima'an and Specia (2016), Multi30K: Multilingual "
                "English-German Image Descriptions, doi:10.18653/v1/W16-3210"
            ),
        ),
        Corpus(
            name="tinyshakespeare",
            title="Tiny Shakespeare, 1,115,394 characters of Shakespeare's plays",
            repository="karpathy/char-rnn",
            commit="6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
            files=(File("tinyshakespeare/input.txt", "data/tinyshakespeare/input.txt"),),
            license="MIT (the repository's README)",
            citation="Karpathy (2015), char-rnn, https://github.com/karpathy/char-rnn",
        ),
    )
}


def get(name: str) -> Corpus:
    """The corpus `name`; a ConfigError lists the known ones otherwise."""
    if name not in CORPORA:
        raise errors.ConfigError(
            f"unknown corpus {name!r}: the named corpora are {', '.join(CORPORA)}"
        )
    return CORPORA[name]


def fetch_command(name: str, root: str | os.PathLike | None = None) -> str:
    """The command that puts corpus `name` into `root` (None: the default data directory)."""
    command = f"python -m {FETCH_MODULE} --corpus={name}"
    if root is not None:
        command += f" --data_dir={shlex.quote(str(root))}"
    return command


@functools.cache
def _sha256(path: pathlib.Path, size: int, mtime: float) -> str:
    del size, mtime  # cache keys: a changed file is hashed again
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (remembered while its size and mtime stay the same)."""
    path = pathlib.Path(path)
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime)


def expected_sum(name: str) -> str:
    """The shipped SHA-256 of `name` (a path under the data directory)."""
    if name not in SHA256:
        raise errors.DataError(f"{name} is not a file of a named corpus: no SHA-256 to check")
    return SHA256[name]


def verify(root: str | os.PathLike, names: Sequence[str], *, fix: str = "") -> None:
    """Checks the files `names` under `root` against the shipped sums (`SHA256`).

    Args:
      root: the data directory.
      names: paths under it, e.g. ["multi30k/train.en"].
      fix: what the user should do about a corrupt file (appended to the message).

    Raises:
      FileNotFoundError: if a file is missing.
      tfjax.errors.DataError: if a name has no shipped sum or a file's SHA-256 differs.
    """
    for name in names:
        expected = expected_sum(name)
        path = pathlib.Path(root) / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file; the data folder is incomplete")
        actual = sha256(path)
        if actual != expected:
            raise errors.DataError(
                f"checksum mismatch for {path}: SHA-256 {actual}, expected {expected} (the sum "
                f"tfjax ships); the file is corrupt or another version{'; ' + fix if fix else ''}"
            )


def status(root: str | os.PathLike, name: str) -> str:
    """Corpus `name` under `root`: "verified", "missing" (no file there), "incomplete" (some
    files missing) or "corrupt" (a file's SHA-256 differs from the shipped one)."""
    root = pathlib.Path(root)
    names = get(name).names()
    present = [n for n in names if (root / n).is_file()]
    if not present:
        return "missing"
    if len(present) < len(names):
        return "incomplete"
    if any(sha256(root / n) != expected_sum(n) for n in names):
        return "corrupt"
    return "verified"
