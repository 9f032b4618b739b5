"""The tokenizer a workdir keeps (`tfjax.data.workdir_tokenizer`, `datasets.load`): damaged,
missing, other than the recorded one, and training data with words it does not know.

Every tokenizer kind a workdir can hold: word and character vocabularies (`tokenizer.json`),
SentencePiece (`tokenizer.model`) and a converted checkpoint's Hugging Face tokenizer
(`hf_tokenizer/`, a tiny BERT WordPiece built here). No model is trained: the tokenizers are
built from a few sentences of the "files" source.
"""

import dataclasses
import hashlib
import json
import logging
import pathlib
import random

import pytest

from tfjax import errors
from tfjax.data import datasets, workdir_tokenizer
from tfjax.models import kinds

PAIRS = [
    ("a man rides a horse", "ein mann reitet ein pferd"),
    ("two dogs play in the snow", "zwei hunde spielen im schnee"),
    ("a girl in a red dress", "ein mädchen in einem roten kleid"),
    ("the men are fishing", "die männer angeln"),
]
KINDS = ("word", "char", "sentencepiece", "pretrained")


def _write_pairs(folder: pathlib.Path, stem: str, pairs) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.en").write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    (folder / f"{stem}.de").write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return str(folder / stem)


def _config(tmp_path: pathlib.Path, kind: str, pairs=PAIRS) -> datasets.DataConfig:
    corpus = tmp_path / "corpus"
    return datasets.DataConfig(
        name="files",
        train_path=_write_pairs(corpus, "train", pairs * 3),
        eval_path=_write_pairs(corpus, "test", pairs[:2]),
        tokenizer=kind,
        vocab_size=40,
        max_source_len=40,
        max_target_len=40,
    )


def _saved(tmp_path: pathlib.Path, kind: str) -> pathlib.Path:
    """A workdir holding a tokenizer of `kind`; returns the tokenizer's path."""
    workdir = tmp_path / "run"
    if kind == "pretrained":
        pytest.importorskip("transformers", reason="needs the 'hf' extra: pip install -e .[hf]")
        pytest.importorskip("torch", reason="tests/hf_checkpoints.py imports torch")
        import hf_checkpoints

        (workdir / datasets.DIRECTORY).mkdir(parents=True)
        hf_checkpoints.bert_tokenizer(workdir / datasets.DIRECTORY)
    else:
        datasets.load(
            _config(tmp_path, kind), kinds.get("encoder_decoder"), seed=0, workdir=workdir
        )
    return workdir_tokenizer.path(kind, workdir)


def _file(location: pathlib.Path) -> pathlib.Path:
    """The file to damage: the tokenizer's, or a Hugging Face directory's tokenizer.json."""
    return location / "tokenizer.json" if location.is_dir() else location


DAMAGES = {
    "random": lambda data: random.Random(0).randbytes(300),
    "cut in half": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
}
JSON_DAMAGES = {  # tokenizer.json only (word, char, Hugging Face)
    "not UTF-8": lambda data: data.replace(b"a", b"\xe9", 1),  # a Latin-1 byte
    "no words": lambda data: json.dumps({"format": json.loads(data).get("format")}).encode(),
}


def _damages(kind: str) -> list:
    extra = JSON_DAMAGES if kind != "sentencepiece" else {}
    return [(kind, name) for name in (*DAMAGES, *extra)]


@pytest.mark.parametrize("kind, damage", [d for kind in KINDS for d in _damages(kind)])
def test_a_damaged_tokenizer_is_one_error_naming_the_file_and_the_fix(tmp_path, kind, damage):
    location = _saved(tmp_path, kind)
    recorded = workdir_tokenizer.sha256(location)
    file = _file(location)
    file.write_bytes({**DAMAGES, **JSON_DAMAGES}[damage](file.read_bytes()))
    hf = "copy the tokenizer files of the Hugging Face checkpoint"
    cases = [  # (trained, the SHA-256 config.json records, the fix)
        (True, recorded, hf if kind == "pretrained" else "put the original back"),
        (False, None, hf if kind == "pretrained" else f"delete {location} and rerun"),
    ]
    if (kind, damage) == ("sentencepiece", "cut in half"):
        cases = cases[:1]  # the first half still parses as a smaller model: only its digest tells
    for trained, expected, fix in cases:
        with pytest.raises(errors.DataError) as info:  # a UserError: one `error:` line
            workdir_tokenizer.load(kind, location.parent, trained=trained, expected_sha256=expected)
        message = str(info.value)
        assert "\n" not in message and str(location) in message and fix in message, message
        assert (recorded in message) == trained  # what to put back: the recorded file
    assert file.is_file()  # refused, not rebuilt over


@pytest.mark.parametrize("kind", KINDS)
def test_the_digest_is_that_of_the_tokenizer_files(tmp_path, kind):
    location = _saved(tmp_path, kind)
    digest = workdir_tokenizer.sha256(location)
    if location.is_file():  # what sha256sum prints
        assert digest == hashlib.sha256(location.read_bytes()).hexdigest()
    else:  # every file counts, and so does its name
        config = location / "tokenizer_config.json"
        config.write_text(config.read_text() + " ")
        assert workdir_tokenizer.sha256(location) != digest
        config.rename(location / "tokenizer_config2.json")
        assert workdir_tokenizer.sha256(location) not in (digest, None)
    assert workdir_tokenizer.sha256(tmp_path / "nothing") is None


def _another(location: pathlib.Path) -> None:
    """Rewrites the tokenizer as another that still loads (same size where it can)."""
    if location.name == datasets.SENTENCEPIECE_FILE:
        from tfjax.data import tokenizers

        other = tokenizers.SentencePieceTokenizer.build(["x y z w"] * 9, vocab_size=12)
        other.save(location)
        return
    file = _file(location)
    payload = json.loads(file.read_text(encoding="utf-8"))
    if "words" in payload:  # two words swap ids: the same size, other ids
        payload["words"][4], payload["words"][5] = payload["words"][5], payload["words"][4]
    else:
        payload["normalizer"] = None  # a Hugging Face tokenizer that tokenizes otherwise
    file.write_text(json.dumps(payload), encoding="utf-8")


@pytest.mark.parametrize("kind", KINDS)
def test_a_tokenizer_other_than_the_recorded_one_is_refused(tmp_path, kind):
    location = _saved(tmp_path, kind)
    recorded = workdir_tokenizer.sha256(location)
    load = lambda: workdir_tokenizer.load(  # noqa: E731
        kind, location.parent, trained=True, expected_sha256=recorded
    )
    assert load() is not None
    _another(location)
    actual = workdir_tokenizer.sha256(location)
    with pytest.raises(errors.DataError) as info:
        load()
    words = [f"{location} is not the tokenizer the checkpoints", actual, recorded, "not built"]
    assert all(word in str(info.value) for word in words), str(info.value)
    # Workdirs from before the digest was recorded take the tokenizer they hold.
    workdir_tokenizer.load(kind, location.parent, trained=True, expected_sha256=None)


@pytest.mark.parametrize("kind", ["word", "char", "sentencepiece"])
def test_a_missing_tokenizer_of_a_trained_workdir_is_refused_not_rebuilt(tmp_path, kind):
    cfg = _config(tmp_path, kind)
    workdir = tmp_path / "run"
    location = _saved(tmp_path, kind)
    recorded = workdir_tokenizer.sha256(location)
    location.unlink()
    with pytest.raises(errors.DataError) as info:
        datasets.load(
            cfg,
            kinds.get("encoder_decoder"),
            seed=0,
            workdir=workdir,
            trained=True,
            tokenizer_sha256=recorded,
        )
    assert f"{location} is missing, but the checkpoints in {workdir} were trained" in str(
        info.value
    )
    assert f"SHA-256 {recorded}" in str(info.value)
    assert not location.exists()
    # A workdir without checkpoints builds one (a new run), and so do the other processes of a
    # multi-process run (`save_tokenizer=False`), which never write it.
    other = datasets.load(
        cfg, kinds.get("encoder_decoder"), seed=0, workdir=workdir, save_tokenizer=False
    )
    assert other.tokenizer.vocab_size > 4 and not location.exists()
    datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=workdir)
    assert workdir_tokenizer.sha256(location) == recorded  # the same data, the same file


def test_new_words_in_the_training_data_warn_once_with_their_count(tmp_path, caplog):
    workdir = tmp_path / "run"
    datasets.load(_config(tmp_path, "word"), kinds.get("encoder_decoder"), seed=0, workdir=workdir)
    # The corpus changed since the tokenizer was built: a pair with 3 unseen words (zebra twice,
    # unicycle), which the training split holds 3 times.
    new = [*PAIRS, ("a zebra rides a unicycle", "ein zebra")]
    cfg = _config(tmp_path, "word", new)
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        examples = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=workdir)
        assert examples.eval and not caplog.records  # the eval split is not the tokenizer's
        assert len(examples.train) == 15
        assert len(examples.train) == 15  # read once: no second warning
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "9 tokens of the training split are not in the workdir's tokenizer" in message
    assert "(tokenizer.json)" in message and "<unk>" in message


def _unknown_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "training split are not in" in r.getMessage()]


def test_unknown_tokens_of_overlapping_lm_windows_are_counted_once(tmp_path, caplog):
    book = tmp_path / "book.txt"
    book.write_text("the cat sat on the mat\nthe mat sat on the cat\n" * 4, encoding="utf-8")
    (tmp_path / "test.txt").write_text("the cat sat on the mat\n", encoding="utf-8")
    paths = {"train_path": str(book), "eval_path": str(tmp_path / "test.txt")}
    cfg = datasets.DataConfig(name="files", **paths, max_target_len=8, lm_stride=1)
    workdir = tmp_path / "run"
    datasets.load(cfg, kinds.get("decoder_only"), seed=0, workdir=workdir)
    # The book changed: 5 unseen words, each in up to 7 of the windows of 8 tokens at every
    # offset.
    book.write_text("a zebra rides a unicycle\n" + book.read_text(), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        assert (
            len(datasets.load(cfg, kinds.get("decoder_only"), seed=0, workdir=workdir).train) > 40
        )
    (message,) = _unknown_warnings(caplog)
    assert "5 tokens of the training split are not in the workdir's tokenizer" in message


def test_an_unchanged_corpus_sentencepiece_did_not_fully_see_warns_nothing(
    tmp_path, caplog, monkeypatch
):
    """SentencePiece learns from a sample of the sentences: characters of the others are
    unknown to it, in the very corpus it was built from."""
    from tfjax.data import tokenizers

    # 400 sentences, 200 with a character of their own; SentencePiece takes at least 101.
    pairs = [(f"{s} {chr(0x4E00 + i)}", t) for i, (s, t) in enumerate(PAIRS * 50)]
    cfg = dataclasses.replace(_config(tmp_path, "sentencepiece", pairs), vocab_size=200)
    workdir = tmp_path / "run"
    monkeypatch.setattr(tokenizers, "SENTENCEPIECE_SAMPLE", 101)
    first = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=workdir)
    assert workdir_tokenizer.unknown_tokens(first.train, first.tokenizer.unk_id) > 0
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        assert datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=workdir).train
    assert not _unknown_warnings(caplog)
