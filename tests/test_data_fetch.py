"""Getting the named corpora: the shipped table, downloads (from `file://` folders and a local
HTTP server: tests never touch the network), `--from` layouts, `python -m experiments.data`, and
the one line a training run without its corpus ends in."""

import functools
import gzip
import hashlib
import http.server
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from experiments import cli, config_utils
from experiments import data as data_cli
from tfjax import errors
from tfjax.data import corpora, fetch, sources

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = "multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a"
CHAR_RNN = "karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
SHAKESPEARE = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


def _texts(name: str) -> dict[str, str]:
    """Stand-in contents of each file of corpus `name`, different per file."""
    return {f: f"{f}: line one\nline two\n" for f in corpora.get(name).names()}


@pytest.fixture
def stand_in(monkeypatch):
    """`stand_in(name)`: stand-in texts for corpus `name`, their sums made the shipped ones."""

    def make(name: str) -> dict[str, str]:
        texts = _texts(name)
        for file, text in texts.items():
            monkeypatch.setitem(corpora.SHA256, file, hashlib.sha256(text.encode()).hexdigest())
        return texts

    return make


def _mirror(folder: pathlib.Path, name: str, texts: dict[str, str]) -> str:
    """A folder laid out as GitHub's raw files at the pinned commit; returns its file:// URL."""
    corpus = corpora.get(name)
    for file in corpus.files:
        path = folder / corpus.url(file, "").lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = texts[file.name].encode()
        path.write_bytes(gzip.compress(data) if file.gzipped else data)
    return folder.as_uri()


def _leftovers(root: pathlib.Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.part"))


# --- the shipped table ------------------------------------------------------------------------


def test_the_shipped_table_names_the_pinned_upstream_files():
    assert sorted(corpora.SHA256) == sorted(n for c in corpora.CORPORA.values() for n in c.names())
    assert all(len(s) == 64 and int(s, 16) >= 0 for s in corpora.SHA256.values())
    multi30k, shakespeare = corpora.get("multi30k"), corpora.get("tinyshakespeare")
    assert multi30k.names() == [
        f"multi30k/{split}.{lang}"
        for split in ("train", "val", "test2016")
        for lang in ("en", "de")
    ]
    test_en = multi30k.files[4]
    assert test_en.name == "multi30k/test2016.en" and test_en.gzipped
    assert multi30k.url(test_en) == (
        f"https://raw.githubusercontent.com/{MULTI30K}/data/task1/raw/test_2016_flickr.en.gz"
    )
    assert shakespeare.url(shakespeare.files[0], "file:///m/") == (
        f"file:///m/{CHAR_RNN}/data/tinyshakespeare/input.txt"
    )
    assert not shakespeare.files[0].gzipped
    assert corpora.SHA256["tinyshakespeare/input.txt"].startswith("86c4e6aa9db7c042")
    with pytest.raises(errors.ConfigError, match="named corpora are multi30k, tinyshakespeare"):
        corpora.get("wmt14")


def test_the_docs_list_the_shipped_sums_and_sources():
    text = (ROOT / "docs" / "data.md").read_text()
    listed = dict(
        reversed(line.split("  "))
        for line in text.splitlines()
        if len(line) > 66 and line[64:66] == "  " and line[:64].isalnum()
    )
    assert listed == corpora.SHA256
    for corpus in corpora.CORPORA.values():
        assert (
            f"[{corpus.repository}](https://github.com/{corpus.repository}) at `{corpus.commit}`"
            in text
        )


def test_the_shipped_sums_are_those_of_the_real_corpora(data_dir):
    for name in corpora.CORPORA:
        assert corpora.status(data_dir, name) == "verified"


# --- downloads --------------------------------------------------------------------------------


def test_download_gunzips_verifies_and_keeps_what_is_in_place(tmp_path, stand_in):
    texts = stand_in("multi30k")
    base = _mirror(tmp_path / "mirror", "multi30k", texts)
    root = tmp_path / "data"
    done = fetch.download("multi30k", root, base_url=base)
    assert [(d.name, d.action) for d in done] == [(n, "installed") for n in texts]
    assert done[0].origin == f"{base}/{MULTI30K}/data/task1/raw/train.en.gz"
    assert {n: (root / n).read_text() for n in texts} == texts
    assert corpora.status(root, "multi30k") == "verified" and not _leftovers(root)
    (root / "multi30k/val.de").write_text("damaged\n")
    for path in (tmp_path / "mirror").rglob("*.gz"):
        if path.name != "val.de.gz":
            path.unlink()  # the files in place are not downloaded again
    again = fetch.download("multi30k", root, base_url=base)
    assert [d.action for d in again] == ["kept"] * 3 + ["installed"] + ["kept"] * 2
    assert (root / "multi30k/val.de").read_text() == texts["multi30k/val.de"]


def test_a_download_with_the_wrong_sum_installs_nothing(tmp_path, stand_in):
    texts = stand_in("tinyshakespeare")
    base = _mirror(tmp_path / "mirror", "tinyshakespeare", {n: t + "x" for n, t in texts.items()})
    with pytest.raises(errors.DataError) as raised:
        fetch.download("tinyshakespeare", tmp_path / "data", base_url=base)
    expected = corpora.SHA256["tinyshakespeare/input.txt"]
    assert f"expected {expected} for tinyshakespeare/input.txt" in str(raised.value)
    assert str(raised.value).endswith(
        f"its original: https://raw.githubusercontent.com/{CHAR_RNN}/data/tinyshakespeare/input.txt"
    )
    assert not (tmp_path / "data" / "tinyshakespeare" / "input.txt").exists()


def test_a_missing_or_broken_upstream_file_is_one_error(tmp_path, stand_in):
    texts = stand_in("multi30k")
    base = _mirror(tmp_path / "mirror", "multi30k", texts)
    (tmp_path / "mirror" / MULTI30K / "data/task1/raw/val.en.gz").unlink()
    with pytest.raises(errors.DataError, match=r"could not download file:.*val\.en\.gz .*--from"):
        fetch.download("multi30k", tmp_path / "data", base_url=base)
    assert corpora.status(tmp_path / "data", "multi30k") == "incomplete"  # train: verified
    (tmp_path / "mirror" / MULTI30K / "data/task1/raw/val.en.gz").write_bytes(b"not gzip")
    with pytest.raises(errors.DataError, match=r"val\.en\.gz is not a valid gzip file"):
        fetch.download("multi30k", tmp_path / "data", base_url=base)
    with pytest.raises(errors.DataError, match="could not download nowhere/"):
        fetch.download("multi30k", tmp_path / "data", base_url="nowhere")
    assert not _leftovers(tmp_path / "data")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_download_over_http_from_a_local_server(tmp_path, stand_in):
    texts = stand_in("tinyshakespeare")
    _mirror(tmp_path / "mirror", "tinyshakespeare", texts)
    handler = functools.partial(_QuietHandler, directory=str(tmp_path / "mirror"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        fetch.download("tinyshakespeare", tmp_path / "data", base_url=base, timeout=10.0)
        with pytest.raises(errors.DataError, match=r"train\.en\.gz \(HTTP 404 File not found\)"):
            fetch.download("multi30k", tmp_path / "data", base_url=base, timeout=10.0)
    finally:
        server.shutdown()
        server.server_close()
    assert corpora.status(tmp_path / "data", "tinyshakespeare") == "verified"


# --- files the user has -----------------------------------------------------------------------


def test_lay_out_takes_a_file_or_a_folder_in_upstream_or_data_names(tmp_path, stand_in):
    texts = stand_in("tinyshakespeare")
    copy = tmp_path / "downloads" / "my copy.txt"
    copy.parent.mkdir()
    copy.write_text(texts["tinyshakespeare/input.txt"])
    done = fetch.lay_out("tinyshakespeare", copy, tmp_path / "data")
    assert [(d.name, d.action, d.origin) for d in done] == [
        ("tinyshakespeare/input.txt", "installed", str(copy))
    ]
    assert corpora.status(tmp_path / "data", "tinyshakespeare") == "verified"

    texts = stand_in("multi30k")
    folder = tmp_path / "raw"
    folder.mkdir()
    for lang in ("en", "de"):  # upstream names gzipped and not, and the data directory's
        train = texts[f"multi30k/train.{lang}"].encode()
        (folder / f"train.{lang}.gz").write_bytes(gzip.compress(train))
        (folder / f"val.{lang}").write_text(texts[f"multi30k/val.{lang}"])
        (folder / f"test_2016_flickr.{lang}").write_text(texts[f"multi30k/test2016.{lang}"])
    fetch.lay_out("multi30k", folder, tmp_path / "data")
    assert corpora.status(tmp_path / "data", "multi30k") == "verified"
    fetch.lay_out("multi30k", tmp_path / "data", tmp_path / "other")  # another data directory
    assert corpora.status(tmp_path / "other", "multi30k") == "verified"


def test_lay_out_refuses_missing_and_wrong_files(tmp_path, stand_in):
    texts = stand_in("multi30k")
    folder = tmp_path / "raw"
    folder.mkdir()
    for name, text in list(texts.items())[:3]:
        (folder / pathlib.PurePath(name).name).write_text(text)
    with pytest.raises(FileNotFoundError) as raised:
        fetch.lay_out("multi30k", folder, tmp_path / "data")
    assert str(raised.value) == (
        f"--from={folder} holds no file for multi30k/val.de: looked for multi30k/val.de, "
        "multi30k/val.de.gz, val.de, val.de.gz, data/task1/raw/val.de, data/task1/raw/val.de.gz"
    )
    (folder / "val.de").write_text("a different file\n")
    with pytest.raises(errors.DataError, match=r"val\.de: SHA-256 [0-9a-f]{64}, expected"):
        fetch.lay_out("multi30k", folder, tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data" / "multi30k").iterdir()) == [
        "train.de",
        "train.en",
        "val.en",
    ]  # each installed file verified, none partial
    with pytest.raises(errors.DataError, match="is a file, but multi30k has 6 files"):
        fetch.lay_out("multi30k", folder / "val.de", tmp_path / "data")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        fetch.lay_out("tinyshakespeare", tmp_path / "nothing", tmp_path / "data")


# --- python -m experiments.data ---------------------------------------------------------------


def _no_data_env(tmp_path: pathlib.Path) -> dict[str, str]:
    """The environment of a user without any corpus: no TFJAX_DATA_DIR, an empty home."""
    env = {k: v for k, v in os.environ.items() if k != sources.DATA_DIR_ENV}
    return dict(env, HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"))


def _data(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "experiments.data", *args],
        cwd=ROOT,
        env=_no_data_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_lists_the_corpora_and_refuses_bad_input_in_one_line(tmp_path):
    root = tmp_path / "cache" / "tfjax" / "data"  # the default data directory of this user
    (root / "tinyshakespeare").mkdir(parents=True)
    (root / "tinyshakespeare" / "input.txt").write_text(SHAKESPEARE)
    (root / "multi30k").mkdir()
    (root / "multi30k" / "train.en").write_text("a\n")
    listed = _data(tmp_path, "--list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == f"data directory: {root}"
    assert lines[1].split()[:2] == ["multi30k", "incomplete"]
    assert lines[4].split()[:2] == ["tinyshakespeare", "corrupt"]
    assert "https://github.com/karpathy/char-rnn at commit 6f9487a6fe5b" in lines[5]
    assert "MIT" in lines[6]
    empty = _data(tmp_path, "--list", f"--data_dir={tmp_path / 'empty'}").stdout.splitlines()
    assert [line.split()[1] for line in (empty[1], empty[4])] == ["missing", "missing"]
    for args, message in [
        ([], "error: give --corpus=NAME (--list names the corpora)"),
        (["--corpus=wmt14"], "error: unknown corpus 'wmt14': the named corpora are multi30k, "),
        (["--list", "--corpus=multi30k"], "error: --list lists every corpus: drop --corpus"),
        (
            ["--corpus=tinyshakespeare", f"--from={root / 'tinyshakespeare' / 'input.txt'}"],
            f"error: {root / 'tinyshakespeare' / 'input.txt'}: SHA-256 ",
        ),
        (
            ["--corpus=tinyshakespeare", f"--base_url={tmp_path.as_uri()}"],
            f"error: could not download {tmp_path.as_uri()}/{CHAR_RNN}/",
        ),
    ]:
        out = _data(tmp_path, *args)
        assert (out.returncode, out.stdout) == (2, ""), (args, out.stderr)
        assert out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr


def test_the_command_reports_what_it_installed(tmp_path, stand_in):
    texts = stand_in("tinyshakespeare")
    base = _mirror(tmp_path / "mirror", "tinyshakespeare", texts)
    lines = data_cli.get_corpus("tinyshakespeare", tmp_path / "data", None, base)
    url = f"{base}/{CHAR_RNN}/data/tinyshakespeare/input.txt"
    assert lines[:2] == [
        f"installed: tinyshakespeare/input.txt (from {url})",
        f"tinyshakespeare: 1 file verified in {tmp_path / 'data'}",
    ]
    assert lines[2].startswith("cite: Karpathy (2015), char-rnn") and "license: MIT" in lines[2]
    again = data_cli.get_corpus("tinyshakespeare", tmp_path / "data", None, "file:///nowhere")
    assert again[0] == "kept: tinyshakespeare/input.txt"
    listed = data_cli.listing(tmp_path / "data")
    assert listed[4].split()[:2] == ["tinyshakespeare", "verified"]


def test_the_command_lays_out_the_real_input_txt(tmp_path, data_dir):
    copy = tmp_path / "input.txt"
    copy.write_bytes((data_dir / "tinyshakespeare" / "input.txt").read_bytes())
    out = _data(tmp_path, "--corpus=tinyshakespeare", f"--from={copy}")
    assert out.returncode == 0, out.stderr
    root = tmp_path / "cache" / "tfjax" / "data"
    assert f"tinyshakespeare: 1 file verified in {root}" in out.stdout
    assert corpora.status(root, "tinyshakespeare") == "verified"


# --- training without the corpus --------------------------------------------------------------


def test_training_without_the_corpus_names_the_command_that_fetches_it(tmp_path):
    command = ["-m", "experiments.train", "--config=configs/shakespeare_char.py:cpu"]
    out = subprocess.run(
        [sys.executable, *command, f"--workdir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=dict(_no_data_env(tmp_path), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith("error: corpus tinyshakespeare is not in the data directory ")
    assert last.endswith("or fetch it with: python -m experiments.data --corpus=tinyshakespeare")
    assert sum(line.startswith("error:") for line in out.stderr.splitlines()) == 1


def test_a_run_with_its_own_data_dir_names_it_in_the_command(tmp_path):
    from tfjax.runs import trainer

    folder = tmp_path / "corpora"
    config = config_utils.load_config("configs/multi30k.py:tiny", [f"data.dir={folder}"])
    with pytest.raises(FileNotFoundError) as raised:
        trainer.train_and_evaluate(config, tmp_path / "run")
    assert cli.message(raised.value).endswith(
        f"fetch it with: python -m experiments.data --corpus=multi30k --data_dir={folder}"
    )
