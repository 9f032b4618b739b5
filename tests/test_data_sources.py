"""Files, named corpora, hub data, SentencePiece/char tokenizers and text-stream LM windows."""

import hashlib
import json
import logging
import pathlib

import numpy as np
import pytest

from tfjax.data import corpora, datasets, sources, tokenizers
from tfjax.models import kinds

PAIRS = [
    ("A man rides a horse .", "Ein Mann reitet ein Pferd ."),
    ("Two dogs play in the snow .", "Zwei Hunde spielen im Schnee ."),
    ("A girl in a red dress .", "Ein Mädchen in einem roten Kleid ."),
    ("The men are fishing .", "Die Männer angeln ."),
]


def _write_parallel(folder: pathlib.Path, stem: str, pairs) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.en").write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    (folder / f"{stem}.de").write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    return str(folder / stem)


def _multi30k_files(pairs) -> dict[str, str]:
    files = {}
    for split in sources.MULTI30K_SPLITS:
        files[f"multi30k/{split}.en"] = "".join(f"{s}\n" for s, _ in pairs)
        files[f"multi30k/{split}.de"] = "".join(f"{t}\n" for _, t in pairs)
    return files


# --- readers and their errors ---------------------------------------------------------------


def test_read_lines_handles_crlf_and_final_newline(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"one\r\ntwo\nthree\n")
    assert sources.read_lines(path) == ["one", "two", "three"]
    path.write_bytes(b"one\ntwo")  # no final newline
    assert sources.read_lines(path) == ["one", "two"]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.en: no such file"):
        sources.read_lines(tmp_path / "nope.en")


def test_undecodable_bytes_name_file_line_and_column(tmp_path):
    path = tmp_path / "latin1.de"
    path.write_bytes("erste Zeile\nzweite\nM\u00e4nner\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.de:3: byte 0xe4 at column 2 is not UTF-8"):
        sources.read_lines(path)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.en"
    path.write_text("\n \n")
    with pytest.raises(ValueError, match=r"empty.en is empty"):
        sources.read_lines(path)


def test_parallel_files_and_mismatched_line_counts(tmp_path):
    prefix = _write_parallel(tmp_path, "train", PAIRS)
    assert sources.read_parallel(f"{prefix}.en", f"{prefix}.de") == PAIRS
    (tmp_path / "train.de").write_text("".join(f"{t}\n" for _, t in PAIRS[:3]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.en has 4 lines, .*train.de has 3"):
        sources.read_parallel(f"{prefix}.en", f"{prefix}.de")


def test_tsv_pairs_and_bad_rows(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    assert sources.read_parallel(path) == PAIRS
    path.write_text("a\tb\nonly one column\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.tsv:2: expected 2 tab-separated columns, found 1"):
        sources.read_parallel(path)


def test_classification_tsv_and_bad_label(tmp_path):
    path = tmp_path / "cls.tsv"
    path.write_text("good film\t1\nbad film\t0\n")
    assert sources.read_classification(path) == [("good film", 1), ("bad film", 0)]
    path.write_text("good film\t1\nbad film\tneg\n")
    with pytest.raises(ValueError, match=r"cls.tsv:2: label 'neg' is not an integer"):
        sources.read_classification(path)


def test_checksums_verified_against_the_shipped_sums_and_mismatch_named(tmp_path, fake_corpus):
    root = fake_corpus(tmp_path, {"multi30k/train.en": "hello\n"})
    corpora.verify(root, ["multi30k/train.en"])
    (root / "multi30k/train.en").write_text("hellO\n")
    with pytest.raises(ValueError, match=r"checksum mismatch for .*train.en: SHA-256 .*; fix"):
        corpora.verify(root, ["multi30k/train.en"], fix="fix")
    with pytest.raises(ValueError, match="no SHA-256 to check"):
        corpora.verify(root, ["multi30k/train.fr"])
    with pytest.raises(FileNotFoundError, match=r"val\.en: no such file"):
        corpora.verify(root, ["multi30k/val.en"])
    tampered = hashlib.sha256(b"hellO\n").hexdigest()
    (root / "SHA256SUMS").write_text(f"{tampered}  multi30k/train.en\n")
    with pytest.raises(ValueError, match="checksum mismatch"):  # a list beside the data is
        corpora.verify(root, ["multi30k/train.en"])  # not read: the shipped sums decide


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sources.data_dir() == tmp_path
    assert sources.data_dir(str(tmp_path / "..")) == tmp_path / ".."
    assert sources.data_dir(str(tmp_path / "missing")) == tmp_path / "missing"  # need not exist
    monkeypatch.delenv(sources.DATA_DIR_ENV)
    assert sources.data_dir() == tmp_path / "xdg" / "tfjax" / "data"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as the spec says
    assert sources.data_dir() == tmp_path / "home" / ".cache" / "tfjax" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert sources.data_dir() == tmp_path / "home" / ".cache" / "tfjax" / "data"
    assert sources.data_dir("~/d") == tmp_path / "home" / "d"


def test_a_missing_corpus_names_the_command_that_fetches_it(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "default"))
    with pytest.raises(FileNotFoundError) as raised:
        sources.tinyshakespeare(tmp_path / "default", "train")
    assert str(raised.value).endswith(": python -m experiments.data --corpus=tinyshakespeare")
    assert "tinyshakespeare/input.txt is missing" in str(raised.value)
    with pytest.raises(FileNotFoundError) as raised:
        sources.multi30k(tmp_path / "my data", "val")
    command = f"python -m experiments.data --corpus=multi30k --data_dir='{tmp_path}/my data'"
    assert str(raised.value).endswith(f": {command}")


# --- tokenizers --------------------------------------------------------------------------------


def test_sentencepiece_round_trip_specials_and_save(tmp_path):
    texts = [t for pair in PAIRS for t in pair] * 5
    sp = tokenizers.SentencePieceTokenizer.build(texts, vocab_size=80)
    ids = sp.encode("Ein Mädchen reitet ein Pferd .", add_bos=True, add_eos=True)
    assert ids[0] == tokenizers.BOS_ID and ids[-1] == tokenizers.EOS_ID
    assert tokenizers.PAD_ID not in ids[1:-1] and tokenizers.EOS_ID not in ids[1:-1]
    assert sp.decode(ids) == "Ein Mädchen reitet ein Pferd ."
    assert sp.decode([*ids, 5, 6]) == "Ein Mädchen reitet ein Pferd ."  # stops at EOS
    sp.save(tmp_path / "tok.model")
    loaded = tokenizers.SentencePieceTokenizer.load(tmp_path / "tok.model")
    assert loaded == sp and loaded.encode("Zwei Hunde") == sp.encode("Zwei Hunde")
    # Same texts, same model: the first run and a rebuild agree.
    assert tokenizers.SentencePieceTokenizer.build(texts, vocab_size=80) == sp


def test_sentencepiece_errors(tmp_path):
    with pytest.raises(ValueError, match=r"raise data.vocab_size"):
        tokenizers.SentencePieceTokenizer.build(["abcdefghijklmnopqrstuvwxyz"], vocab_size=10)
    with pytest.raises(ValueError, match="model_type"):
        tokenizers.SentencePieceTokenizer.build(["a b"], vocab_size=10, model_type="wordpiece")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        tokenizers.SentencePieceTokenizer.load(tmp_path / "bad.model")


def test_char_tokenizer_literal(tmp_path):
    tok = tokenizers.CharTokenizer.build(["abba\n"])
    # Specials, then characters by count (a and b twice), ties by code point.
    assert tok.words == (*tokenizers.SPECIAL_TOKENS, "a", "b", "\n")
    assert tok.encode("ab\na", add_eos=True) == [4, 5, 6, 4, tokenizers.EOS_ID]
    assert tok.decode([5, 4, 6, tokenizers.EOS_ID, 4]) == "ba\n"
    tok.save(tmp_path / "chars.json")
    assert tokenizers.CharTokenizer.load(tmp_path / "chars.json") == tok
    with pytest.raises(ValueError, match="not a saved WordTokenizer"):
        tokenizers.WordTokenizer.load(tmp_path / "chars.json")


# --- text-stream windows -----------------------------------------------------------------------


def test_eval_windows_predict_every_token_once():
    ids = np.arange(10, 30, dtype=np.int32)  # 20 tokens
    windows = datasets.text_windows(ids, 6, 5, full=False)
    predicted = [
        int(t)
        for w in windows
        for t, s, m in zip(
            w["targets"], w["targets_segment_ids"], w["targets_weights"], strict=True
        )
        if s and m
    ]
    assert predicted == list(range(11, 30))  # every token but the first, once, in order
    # Each window's first token is the previous window's last: the context carries over.
    assert windows[1]["targets"][0] == windows[0]["targets"][5]


def test_train_windows_are_full_and_strided():
    ids = np.arange(20, dtype=np.int32)
    windows = datasets.text_windows(ids, 6, 3, full=True)
    assert [int(w["targets"][0]) for w in windows] == [0, 3, 6, 9, 12]
    assert all(w["targets_segment_ids"].all() for w in windows)
    sampled = datasets.sample_windows(ids, 6, 50, seed=0)
    assert all(np.array_equal(np.diff(w["targets"]), np.ones(5)) for w in sampled)


def test_train_windows_are_read_only_views_of_a_private_copy():
    ids = np.arange(20, dtype=np.int32)
    windows = datasets.text_windows(ids, 6, 1, full=True)  # nanoGPT's: a window at every token
    assert len(windows) == 15
    assert np.shares_memory(windows[0]["targets"], windows[1]["targets"])  # views, not copies
    ids[:] = 0  # the caller's array is not the windows' memory
    assert windows[3]["targets"].tolist() == [3, 4, 5, 6, 7, 8]
    assert windows[3]["targets_weights"].tolist() == [0, 1, 1, 1, 1, 1]
    assert windows[3]["targets_segment_ids"].tolist() == [1] * 6
    for key in ("targets", "targets_segment_ids", "targets_weights"):
        with pytest.raises(ValueError, match="read-only"):
            windows[0][key][1] = 7  # shared by every window: a write would change them all


# --- datasets.load on files, corpora and hub ----------------------------------------------------


def test_files_translation_with_sentencepiece(tmp_path):
    train = _write_parallel(tmp_path / "corpus", "train", PAIRS * 3)
    test = _write_parallel(tmp_path / "corpus", "test", PAIRS[:2])
    cfg = datasets.DataConfig(
        name="files",
        train_path=train,
        eval_path=test,
        tokenizer="sentencepiece",
        vocab_size=60,
        max_source_len=48,
        max_target_len=48,
    )
    examples = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=tmp_path / "run")
    assert (tmp_path / "run" / datasets.SENTENCEPIECE_FILE).is_file()
    assert len(examples.train) == 12 and examples.references == [t for _, t in PAIRS[:2]]
    decoded = examples.tokenizer.decode(examples.eval[1]["targets"])
    assert decoded == PAIRS[1][1]
    again = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0, workdir=tmp_path / "run")
    assert again.tokenizer == examples.tokenizer  # reloaded from the workdir


@pytest.mark.parametrize("kind, text", [("encoder_decoder", False), ("decoder_only", True)])
def test_a_saved_tokenizer_defers_each_split_until_it_is_used(tmp_path, monkeypatch, kind, text):
    """With the workdir's tokenizer, `load` reads nothing; each split is read on first use,
    once, and holds what the first load (which built the tokenizer) encoded."""
    corpus = tmp_path / "corpus"
    if text:
        (tmp_path / "train.txt").write_text("the cat sat\non the mat\n" * 20)
        (tmp_path / "test.txt").write_text("the mat sat on the cat\n" * 3)
        paths = {"train_path": str(tmp_path / "train.txt"), "eval_path": str(tmp_path / "test.txt")}
    else:
        paths = {
            "train_path": _write_parallel(corpus, "train", PAIRS * 3),
            "eval_path": _write_parallel(corpus, "test", PAIRS[:3]),
        }
    cfg = datasets.DataConfig(name="files", max_source_len=12, max_target_len=12, **paths)
    built = datasets.load(cfg, kinds.get(kind), seed=0, workdir=tmp_path / "run")
    reads, read = [], datasets._read
    monkeypatch.setattr(datasets, "_read", lambda *a: reads.append(a[-1]) or read(*a))
    deferred = datasets.load(cfg, kinds.get(kind), seed=0, workdir=tmp_path / "run")
    assert reads == [] and deferred.tokenizer == built.tokenizer
    assert deferred.format == built.format
    _assert_same_rows(deferred.eval, built.eval)
    assert deferred.references == built.references
    if text:
        np.testing.assert_array_equal(deferred.eval_stream, built.eval_stream)
    else:
        assert deferred.eval_stream is None
    assert reads == ["test"]
    _assert_same_rows(deferred.train, built.train)
    assert deferred.read() is deferred and reads == ["test", "train"]


def _assert_same_rows(rows, expected):
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert row.keys() == want.keys()
        for key in row:
            np.testing.assert_array_equal(row[key], want[key])


def test_files_classification_tsv(tmp_path):
    (tmp_path / "train.tsv").write_text("good film\t1\nbad film\t0\nfine film\t1\n")
    (tmp_path / "test.tsv").write_text("good\t1\n")
    cfg = datasets.DataConfig(
        name="files",
        train_path=str(tmp_path / "train.tsv"),
        eval_path=str(tmp_path / "test.tsv"),
    )
    examples = datasets.load(cfg, kinds.get("encoder_only"), seed=0)
    assert [int(e["labels"]) for e in examples.train] == [1, 0, 1]


def test_files_plain_text_lm_uses_the_last_tenth_for_eval(tmp_path):
    text = "".join(f"line {i} of the text\n" for i in range(200))
    (tmp_path / "book.txt").write_text(text)
    cfg = datasets.DataConfig(
        name="files", train_path=str(tmp_path / "book.txt"), tokenizer="char", max_target_len=33
    )
    examples = datasets.load(cfg, kinds.get("decoder_only"), seed=0)
    cut = int(0.9 * len(text))
    assert examples.tokenizer.decode(examples.eval_stream) == text[cut:]
    scored = sum(int((e["targets_weights"] > 0).sum()) for e in examples.eval)
    assert scored == len(text) - cut - 1


def test_empty_split_and_missing_eval_path(tmp_path):
    train = _write_parallel(tmp_path, "train", PAIRS)
    cfg = datasets.DataConfig(name="files", train_path=train)
    with pytest.raises(ValueError, match=r"need data.eval_path"):
        datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    with pytest.raises(ValueError, match=r"needs data.train_path"):
        datasets.DataConfig(name="files")
    with pytest.raises(ValueError, match="eval_split='test' is not a split of 'multi30k'"):
        datasets.DataConfig(name="multi30k")


def test_multi30k_on_a_fake_folder_and_corrupt_file(tmp_path, fake_corpus):
    root = fake_corpus(tmp_path / "data", _multi30k_files(PAIRS))
    cfg = datasets.DataConfig(name="multi30k", dir=str(root), eval_split="val", tokenizer="word")
    examples = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    assert examples.references == [t for _, t in PAIRS]
    reverse = datasets.DataConfig(
        name="multi30k", dir=str(root), eval_split="val", source_lang="de", target_lang="en"
    )
    assert datasets.load(reverse, kinds.get("encoder_decoder"), seed=0).references == [
        s for s, _ in PAIRS
    ]
    (root / "multi30k" / "val.de").write_text("tampered\n")
    with pytest.raises(ValueError, match=r"checksum mismatch for .*val.de.*--corpus=multi30k"):
        datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)


def test_hub_reads_translation_records_offline(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="the hub extra (Hugging Face datasets) is missing")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for split, pairs in (("train", PAIRS * 2), ("validation", PAIRS[:2])):
        records = [{"translation": {"de": t, "en": s}} for s, t in pairs]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = datasets.DataConfig(
        name="hub",
        hub_name="json",
        train_path=str(tmp_path / "train.jsonl"),
        eval_path=str(tmp_path / "validation.jsonl"),
        eval_split="validation",
    )
    examples = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    assert len(examples.train) == 8 and examples.references == [t for _, t in PAIRS[:2]]
    with pytest.raises(ValueError, match="not 'en' and 'fr'"):
        sources.hub_pairs(
            "json",
            "train",
            source_lang="en",
            target_lang="fr",
            data_files=str(tmp_path / "train.jsonl"),
        )


def test_dropped_examples_are_logged(tmp_path, caplog, fake_corpus):
    root = fake_corpus(tmp_path, _multi30k_files(PAIRS))
    cfg = datasets.DataConfig(
        name="multi30k", dir=str(root), eval_split="val", max_source_len=7, max_target_len=7
    )
    with caplog.at_level(logging.WARNING):
        examples = datasets.load(cfg, kinds.get("encoder_decoder"), seed=0)
    assert "Dropped 2 of 4 seq2seq examples" in caplog.text
    assert examples.references == [PAIRS[0][1], PAIRS[3][1]]  # 7 ids or fewer with EOS


# --- the real corpora --------------------------------------------------------------------------


def test_multi30k_shared_corpus(data_dir):
    train = sources.multi30k(data_dir, "train")
    test = sources.multi30k(data_dir, "test2016")
    assert (len(train), len(test)) == (29000, 1000)
    assert len(sources.multi30k(data_dir, "val", source_lang="de", target_lang="en")) == 1014


def test_tinyshakespeare_shared_corpus_split(data_dir):
    train = sources.tinyshakespeare(data_dir, "train")
    val = sources.tinyshakespeare(data_dir, "val")
    assert (len(train), len(val)) == (1_003_854, 111_540)  # nanoGPT's prepare.py counts
    assert len(set(train + val)) == 65
