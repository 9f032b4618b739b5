"""Puts a named corpus into the data directory: downloaded from its pinned upstream files, or
laid out from files the user already has (`python -m experiments.data`).

Either way each file is checked against the SHA-256 sum tfjax ships (`tfjax.data.corpora`)
before it is installed, and installed atomically (written to a temporary file beside its place,
then renamed), so the data directory never holds a partial or unverified file:
  * `download(name, root)` reads `corpus.url(file, base_url)` for each file with urllib and
    gunzips the files upstream keeps gzipped. Files already in place and verified are kept
    without a download. `base_url` names a mirror with the same layout, or a `file://` folder
    (how the tests run it offline).
  * `lay_out(name, source, root)` takes the files from `source`: for a corpus of one file, that
    file itself (a copy of Tiny Shakespeare's input.txt); otherwise a folder holding each file
    under one of the names `candidates` lists: its data-directory path (another data
    directory), its name there (`train.en`), its upstream path (a checkout of the upstream
    repository) or its upstream name (`test_2016_flickr.en`), each also gzipped (`.gz`).
"""

import dataclasses
import gzip
import hashlib
import http.client
import os
import pathlib
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Callable

from tfjax import errors
from tfjax.data import corpora

TIMEOUT_SECONDS = 60.0  # per request


@dataclasses.dataclass(frozen=True)
class Installed:
    """What happened to one file: `action` is "installed" (from `origin`) or "kept" (it was in
    place and verified already)."""

    name: str
    action: str
    origin: str


def download(
    name: str,
    root: str | os.PathLike,
    *,
    base_url: str = corpora.GITHUB_RAW,
    timeout: float = TIMEOUT_SECONDS,
) -> list[Installed]:
    """Downloads corpus `name` into `root` from its pinned upstream files.

    Args:
      name: a named corpus (`corpora.CORPORA`).
      root: the data directory (created if missing).
      base_url: where the upstream repositories are served, `<base>/<owner>/<repo>/<commit>/
        <path>`: GitHub's raw files by default, or a mirror, or a `file://` folder.
      timeout: seconds to wait for each response.

    Returns:
      One `Installed` per file of the corpus.

    Raises:
      tfjax.errors.DataError: if a file cannot be downloaded (no network, an HTTP error), is
        not valid gzip where upstream gzips it, or does not match its shipped sum.
      tfjax.errors.ConfigError: for an unknown corpus.
    """
    corpus = corpora.get(name)

    def read(file: corpora.File) -> tuple[bytes, str]:
        url = corpus.url(file, base_url)
        return _unpacked(_fetch_url(url, timeout), file.gzipped, url), url

    return _install_all(corpus, pathlib.Path(root), read, keep_verified=True)


def lay_out(name: str, source: str | os.PathLike, root: str | os.PathLike) -> list[Installed]:
    """Copies corpus `name` into `root` from files the user has (see the module docstring).

    Every file is read from `source` and verified, also those already in place.

    Raises:
      FileNotFoundError: if `source` does not exist or holds no file for one of the corpus's
        files (the names looked for are listed).
      tfjax.errors.DataError: for a file that is not valid gzip or does not match its sum.
    """
    corpus, source = corpora.get(name), pathlib.Path(source).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"--from={source}: no such file or folder")
    if source.is_file() and len(corpus.files) > 1:
        raise errors.DataError(
            f"--from={source} is a file, but {name} has {len(corpus.files)} files: give the "
            f"folder that holds them ({', '.join(pathlib.PurePath(n).name for n in corpus.names())}"
            ", or their upstream .gz files)"
        )

    def read(file: corpora.File) -> tuple[bytes, str]:
        path = source if source.is_file() else _find(source, file)
        return _unpacked(path.read_bytes(), path.name.endswith(".gz"), str(path)), str(path)

    return _install_all(corpus, pathlib.Path(root), read, keep_verified=False)


def candidates(file: corpora.File) -> list[str]:
    """The names under a `--from` folder that may hold `file`, in the order they are tried."""
    upstream = file.upstream.removesuffix(".gz")
    plain = [file.name, pathlib.PurePosixPath(file.name).name]
    plain += [upstream, pathlib.PurePosixPath(upstream).name]
    names = [n for name in plain for n in (name, f"{name}.gz")]
    return list(dict.fromkeys(names))  # unique, in order


def _find(folder: pathlib.Path, file: corpora.File) -> pathlib.Path:
    names = candidates(file)
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"--from={folder} holds no file for {file.name}: looked for {', '.join(names)}"
    )


def _install_all(
    corpus: corpora.Corpus,
    root: pathlib.Path,
    read: Callable[[corpora.File], tuple[bytes, str]],
    *,
    keep_verified: bool,
) -> list[Installed]:
    """Reads, verifies and installs each file of `corpus` under `root` (see the callers)."""
    done = []
    for file in corpus.files:
        target = root / file.name
        expected = corpora.expected_sum(file.name)
        if keep_verified and target.is_file() and corpora.sha256(target) == expected:
            done.append(Installed(file.name, "kept", str(target)))
            continue
        data, origin = read(file)
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise errors.DataError(
                f"{origin}: SHA-256 {actual}, expected {expected} for {file.name}: not the file "
                f"of {corpus.repository} at commit {corpus.commit[:7]}; its original: "
                f"{corpus.url(file)}"
            )
        _write_atomically(target, data)
        done.append(Installed(file.name, "installed", origin))
    return done


def _fetch_url(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        reason = f"HTTP {error.code} {error.reason}"
    except (OSError, ValueError, http.client.HTTPException) as error:
        reason = str(getattr(error, "reason", None) or error) or type(error).__name__
    raise errors.DataError(
        f"could not download {url} ({reason}): check the network, or download the files "
        "yourself and lay them out with --from=PATH (docs/data.md)"
    )


def _unpacked(data: bytes, gzipped: bool, origin: str) -> bytes:
    if not gzipped:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise errors.DataError(f"{origin} is not a valid gzip file ({error})") from None


def _write_atomically(target: pathlib.Path, data: bytes) -> None:
    """Writes `data` to `target` through a temporary file in the same folder and a rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(temporary, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
