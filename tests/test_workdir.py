"""The road from a workdir to text (`tfjax.runs.trained`, `tfjax.runs.evaluator`) and its CLIs.

Tiny workdirs are trained once per module, in-process, one per model kind and tokenizer kind
(word, character, SentencePiece): encoder-decoders on the small `reverse` task, whose eval split
decodes in seconds, decoder-only LMs (`configs/lm.py:tiny`) and encoder-only classifiers
(`configs/classify.py:tiny`). Every entry point is tested on every
workdir it accepts and refuses every other with a message that names the right tool. The tests
that start `python -m experiments.*` subprocesses are marked slow.
"""

import functools
import json
import pathlib
import shutil

import numpy as np
import pytest
import tiny_runs
from tiny_runs import REVERSE

from experiments import config_utils
from tfjax import errors
from tfjax.data import datasets, tokenizers
from tfjax.inference import decoding
from tfjax.runs import evaluator, trainer
from tfjax.runs import trained as trained_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPM_LENGTHS = ["data.max_source_len=24", "data.max_target_len=24"]  # more pieces than words
RUNS = {  # name: (config spec, overrides)
    "seq2seq_word": ("configs/base.py:tiny", REVERSE),
    "seq2seq_spm": (
        "configs/base.py:tiny",
        [*REVERSE, "data.tokenizer=sentencepiece", "data.vocab_size=20", *SPM_LENGTHS],
    ),
    "lm_word": ("configs/lm.py:tiny", ["train.num_train_steps=2"]),
    "lm_char": (
        "configs/lm.py:tiny",
        ["train.num_train_steps=2", "data.tokenizer=char", "data.max_target_len=48"],
    ),
    "seq2seq_char": (
        "configs/base.py:tiny",
        [*REVERSE, "data.tokenizer=char", "data.max_source_len=20", "data.max_target_len=20"],
    ),
    "lm_spm": (
        "configs/lm.py:tiny",
        [
            "train.num_train_steps=2",
            "data.tokenizer=sentencepiece",
            "data.vocab_size=40",
            "data.max_target_len=48",
        ],
    ),
    "classify": ("configs/classify.py:tiny", ["train.num_train_steps=2"]),
    "classify_char": (
        "configs/classify.py:tiny",
        ["train.num_train_steps=2", "data.tokenizer=char"],
    ),
    "classify_spm": (
        "configs/classify.py:tiny",
        ["train.num_train_steps=2", "data.tokenizer=sentencepiece", "data.vocab_size=30"],
    ),
}
KIND_OF = {name: name.split("_")[0] for name in RUNS}  # seq2seq, lm or classify
# The default suite trains these five (every model kind, every tokenizer kind); the tests on the
# other four workdirs run in the slow tier.
DEFAULT_RUNS = ("seq2seq_word", "seq2seq_spm", "lm_word", "lm_char", "classify_spm")


def runs(*names: str) -> list:
    """`names` (default: all of RUNS) as parameters, those outside DEFAULT_RUNS marked slow."""
    return [
        name if name in DEFAULT_RUNS else pytest.param(name, marks=pytest.mark.slow)
        for name in names or RUNS
    ]


LONG_LINE = " ".join(f"s{i % 10}" for i in range(12))  # 12 words; the word model reads 7 (+ EOS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`trained(name)` -> the workdir of RUNS[name], trained on first use."""

    @functools.cache
    def make(name: str) -> pathlib.Path:
        spec, overrides = RUNS[name]
        path = tmp_path_factory.mktemp(name)
        trainer.train_and_evaluate(config_utils.load_config(spec, overrides), path)
        return path

    return make


# ---------------------------------------------------------------------------------------------
# load: one object per model kind, errors that name the right tool


@pytest.mark.parametrize("name", runs())
def test_load_gives_the_decoder_of_each_kind(trained, name):
    cls = {
        "seq2seq": trained_lib.Translator,
        "lm": trained_lib.Generator,
        "classify": trained_lib.Trained,
    }
    loaded = trained_lib.load(trained(name))
    assert type(loaded) is cls[KIND_OF[name]] and loaded.step == 2
    assert loaded.config.model.kind == loaded.run.model_config.kind
    text = "1 0 1" if name.startswith("classify") else "s1 s2 s3"
    ids = loaded.tokenizer.encode(text)
    assert loaded.detokenize([*ids, tokenizers.EOS_ID, *ids]) == text  # stops at EOS


@pytest.mark.parametrize(
    "name, kinds, expected",
    [
        (
            "lm_word",
            ("encoder_decoder",),
            r"kind decoder_only.*use python -m experiments\.generate",
        ),
        ("seq2seq_word", ("decoder_only",), r"use python -m experiments\.translate"),
        ("classify", ("encoder_decoder",), r"use python -m experiments\.evaluate"),
    ],
)
def test_load_refuses_another_kind(trained, name, kinds, expected):
    with pytest.raises(trained_lib.WorkdirError, match=expected):
        trained_lib.load(trained(name), kinds=kinds, tool="test")


def test_load_errors_name_the_fix(trained, tmp_path):
    with pytest.raises(trained_lib.WorkdirError, match=r"holds no trained run.*experiments\.train"):
        trained_lib.load(tmp_path)
    shutil.copy(trained("seq2seq_word") / "config.json", tmp_path / "config.json")
    with pytest.raises(trained_lib.WorkdirError, match=r"holds no checkpoint.*experiments\.train"):
        trained_lib.load(tmp_path)
    with pytest.raises(trained_lib.WorkdirError, match="choose one of test, train"):
        trained_lib.load(trained("seq2seq_word"), split="valid")
    with pytest.raises(trained_lib.WorkdirError, match="average_last must be >= 1"):
        trained_lib.load(trained("seq2seq_word"), average_last=0)


def test_load_reports_a_missing_data_directory_as_such(trained, tmp_path, monkeypatch):
    """Building the run can fail on missing data before any checkpoint is read: that error
    must reach the user unchanged, not as "holds no checkpoint" (whose fix is wrong)."""
    from tfjax.data import sources
    from tfjax.runs import build

    def build_without_data(config, path):
        sources.tinyshakespeare(tmp_path / "missing", "train")  # raises: no corpus there

    monkeypatch.setattr(build, "build", build_without_data)
    with pytest.raises(FileNotFoundError, match=r"corpus tinyshakespeare is not in .*missing"):
        trained_lib.load(trained("seq2seq_word"))


# ---------------------------------------------------------------------------------------------
# Translator


def test_translator_encode_truncates_and_warns(trained):
    translator = trained_lib.load(trained("seq2seq_word"))  # data.max_source_len = 8
    lines = ["s1 s2", "", LONG_LINE, "s1 zz s2 yy", "zz"]
    encoded, warnings = translator.encode(lines)
    s1, s2, *_ = (translator.tokenizer.encode(f"s{i}")[0] for i in range(1, 10))
    eos, unk = tokenizers.EOS_ID, tokenizers.UNK_ID
    assert encoded[0] == [s1, s2, eos] and encoded[1] is None
    assert encoded[2] == [*translator.tokenizer.encode(LONG_LINE)[:7], eos]
    assert encoded[3] == [s1, unk, s2, unk, eos] and encoded[4] == [unk, eos]
    assert len(warnings) == 3  # empty line 2, long line 3, unknown words once (line 4)
    assert "line 2 is empty" in warnings[0]
    assert "line 3 has 12 tokens" in warnings[1] and "first 7 tokens" in warnings[1]
    assert "line 4: yy, zz not in the model's vocabulary" in warnings[2]


@pytest.mark.parametrize("name", runs("seq2seq_word", "seq2seq_spm", "seq2seq_char"))
def test_translate_keeps_one_output_per_line(trained, name):
    translator = trained_lib.load(trained(name))
    limit = translator.config.data.max_source_len - 1
    long_line = " ".join(f"s{i % 10}" for i in range(limit + 3))  # too long for either tokenizer
    lines = ["s1 s2 s3", "", long_line, "s4 zz"]
    outputs, warnings = translator.translate(lines, beam_size=1)
    assert len(outputs) == 4 and outputs[1] == ""
    assert any("line 2 is empty" in w for w in warnings)
    assert any(w.startswith("line 3 has") and "truncated" in w for w in warnings)
    assert any("line 4: zz not in the model's vocabulary" in w for w in warnings)
    # encode + decode is translate; the truncated line decodes as its kept tokens do.
    encoded, _ = translator.encode(lines)
    assert translator.decode([ids for ids in encoded if ids], beam_size=1) == [
        o for o, ids in zip(outputs, encoded, strict=True) if ids
    ]
    kept = translator.detokenize(encoded[2][:-1])
    assert translator.translate([kept], beam_size=1)[0] == outputs[2:3]
    beam, _ = translator.translate(lines, beam_size=2)
    assert len(beam) == 4 and beam[1] == ""


def test_translate_option_errors(trained):
    translator = trained_lib.load(trained("seq2seq_word"))
    with pytest.raises(trained_lib.WorkdirError, match="beam_size and batch_size must be >= 1"):
        translator.translate(["s1"], beam_size=0)
    with pytest.raises(trained_lib.WorkdirError, match="max_length=-1: max_length must be >= 1"):
        translator.translate(["s1"], max_length=-1)


# ---------------------------------------------------------------------------------------------
# Generator


def test_generator_encode_pads_right_and_warns(trained):
    generator = trained_lib.load(trained("lm_word"))
    tokens, lengths, warnings = generator.encode(["s1 |", "s2 s1 s2 |", "s1 q"], 8)
    assert tokens.shape == (3, 4) and lengths.tolist() == [2, 4, 2]
    assert tokens[0, 2:].tolist() == [0, 0]
    assert warnings == ["prompt 3: q not in the model's vocabulary, read as <unk>"]
    chars = trained_lib.load(trained("lm_char"))
    assert chars.encode(["s1 s", "s1 sx"], 8)[2] == [
        "prompt 2: sx not in the model's vocabulary, read as <unk>"
    ]
    with pytest.raises(trained_lib.WorkdirError, match="prompt 2 has 4 tokens"):
        generator.encode(["s1", "s1 s2 s1 s2"], 4)
    with pytest.raises(trained_lib.WorkdirError, match="no prompt"):
        generator.encode([], 4)


@pytest.mark.parametrize("name", runs("lm_word", "lm_char", "lm_spm"))
def test_generate_batches_prompts_of_different_lengths(trained, name):
    generator = trained_lib.load(trained(name))
    prompts = ["s1 s2 |", "s3 s1 s4 s5 s0 |"]
    outputs, warnings = generator.generate(prompts)
    assert len(outputs) == 2 and not warnings
    # Padding one prompt to the other's length changes nothing: each alone gives the same.
    assert [generator.generate([p])[0][0] for p in prompts] == outputs
    sampled, _ = generator.generate(prompts, temperature=1.0, top_k=3, seed=1)
    assert len(sampled) == 2
    # Past the trained length a window slides on; up to it the text is the cached one.
    trained_length = generator.config.data.max_target_len
    longer, _ = generator.generate(prompts, max_length=trained_length + 6)
    assert all(a.startswith(b) for a, b in zip(longer, outputs, strict=True))
    too_long = " ".join(["s1"] * trained_length)
    with pytest.raises(trained_lib.WorkdirError, match="trained length"):
        generator.generate([too_long], max_length=1000)
    with pytest.raises(trained_lib.WorkdirError, match="top_p"):
        generator.generate(prompts, top_p=0.0)


def test_generator_compiles_once_for_calls_of_the_same_shape(trained, monkeypatch):
    generator = trained_lib.load(trained("lm_word"))
    traces = []
    generate = decoding.generate
    monkeypatch.setattr(decoding, "generate", lambda *a, **k: traces.append(1) or generate(*a, **k))
    length = generator.config.data.max_target_len - 1  # a program no other test compiled
    first, _ = generator.generate(["s1 s2 |"], max_length=length, temperature=0.5, seed=1)
    again, _ = generator.generate(["s1 s2 |"], max_length=length, temperature=0.5, seed=1)
    generator.generate(["s2 s3 |"], max_length=length, temperature=0.5, seed=2)  # new rng only
    assert again == first and len(traces) == 1  # one trace, then the compiled program
    generator.generate(["s2 s3 |"], max_length=length, temperature=0.7, seed=2)
    assert len(traces) == 2  # another temperature is another program


# ---------------------------------------------------------------------------------------------
# evaluate_workdir


def test_evaluate_writes_scores_and_hypotheses(trained):
    path = trained("seq2seq_word")
    record = evaluator.evaluate_workdir(path, beam_size=1)
    saved = json.loads((path / "eval.json").read_text())
    assert saved == record
    assert {"bleu", "chrf", "exact_match", "loss", "perplexity", "accuracy"} <= set(saved)
    assert saved["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert (saved["split"], saved["step"], saved["beam_size"]) == ("test", 2, 1)
    hypotheses = (path / saved["hypotheses"]).read_text().splitlines()
    assert saved["hypotheses"] == "eval/test_step2_beam1.hyp.txt"
    assert len(hypotheses) == saved["num_examples"] == 10
    # The cached greedy decoder agrees with the trainer's uncached one.
    assert saved["exact_match"] == saved["greedy_exact_match"]
    assert (path / "eval" / "test_step2_beam1.json").exists()


def test_evaluate_with_oracle_lengths_ends_hypotheses_where_references_end(trained):
    path = trained("seq2seq_word")
    record = evaluator.evaluate_workdir(path, beam_size=1, oracle_length=True)
    assert record["oracle_length"] is True
    assert record["hypotheses"] == "eval/test_step2_beam1_oracle.hyp.txt"
    hypotheses = (path / record["hypotheses"]).read_text().splitlines()
    run = trained_lib.load(path)
    references = [run.tokenizer.decode(e["targets"]) for e in run.run.examples.eval]
    # every hypothesis has its reference's number of tokens (the word tokenizer: words)
    assert [len(h.split()) for h in hypotheses] == [len(r.split()) for r in references]
    assert "ORACLE output lengths" in evaluator.report(record)
    with pytest.raises(trained_lib.WorkdirError, match="greedy decoding"):
        evaluator.evaluate_workdir(path, beam_size=2, oracle_length=True)


def test_evaluate_beam_search_train_split_and_sentencepiece(trained):
    path = trained("seq2seq_spm")
    record = evaluator.evaluate_workdir(path, split="train", beam_size=2, max_examples=3)
    assert (record["split"], record["beam_size"], record["num_examples"]) == ("train", 2, 3)
    assert (path / "eval" / "train_step2_beam2_alpha0.6.hyp.txt").exists()
    assert 0.0 <= record["bleu"] <= 100.0


def test_evaluate_keeps_one_record_per_length_penalty(trained):
    path = trained("seq2seq_word")
    records = {
        alpha: evaluator.evaluate_workdir(path, beam_size=2, alpha=alpha) for alpha in (0.0, 1.5)
    }
    for alpha, record in records.items():
        assert record["hypotheses"] == f"eval/test_step2_beam2_alpha{alpha:g}.hyp.txt"
        saved = json.loads((path / "eval" / f"test_step2_beam2_alpha{alpha:g}.json").read_text())
        assert saved == record and saved["alpha"] == alpha


@pytest.mark.parametrize(
    "name", runs("lm_word", "lm_char", "lm_spm", "classify", "classify_char", "classify_spm")
)
def test_evaluate_teacher_forced_runs(trained, name):
    path = trained(name)
    record = evaluator.evaluate_workdir(path)
    assert {"loss", "accuracy"} <= set(record)
    assert "bleu" not in record and "beam_size" not in record
    assert json.loads((path / "eval.json").read_text()) == record
    with pytest.raises(trained_lib.WorkdirError, match="drop --oracle_length"):
        evaluator.evaluate_workdir(path, oracle_length=True)


@pytest.mark.parametrize("name", runs())
def test_attention_maps_of_every_model_and_tokenizer_kind(trained, name):
    run = trained_lib.load(trained(name))
    tokenizer = run.tokenizer
    text = tokenizer.decode(range(4, min(8, tokenizer.vocab_size)))  # ordinary tokens
    maps, shown = run.attention(text)
    ids = tokenizer.encode(text)
    layers = {n.split("/")[-1] for n in maps.weights}
    if KIND_OF[name] == "seq2seq":
        (translation,), _ = run.translate([text], beam_size=1)
        assert shown == translation and layers == {"self_attention", "cross_attention"}
        cross = maps.layers("cross_attention")[-1]
        assert maps.keys[cross] == tokenizer.pieces([*ids, tokenizers.EOS_ID])
        rows = maps.queries[cross]  # the output up to EOS, or all it could produce
        assert rows[-1] == "<eos>" or len(rows) == run.config.data.max_target_len
    else:
        assert shown == text and layers == {"self_attention"}
        first = next(iter(maps.weights))
        bos = [tokenizers.BOS_ID] if KIND_OF[name] == "classify" else []
        expected = tokenizer.pieces([*bos, *ids])
        assert maps.keys[first] == (expected if bos else ["<bos>", *expected[:-1]])
    for layer, weights in maps.weights.items():
        assert weights.shape[1:] == (len(maps.queries[layer]), len(maps.keys[layer])), layer
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5, err_msg=layer)
    with pytest.raises(trained_lib.WorkdirError, match="the text is empty"):
        run.attention("  ")
    statistics = run.attention_statistics(num_examples=3)
    assert list(statistics) == list(maps.weights)
    first = run.attention_statistics(num_examples=1)  # num_examples is honoured
    assert all(first[n]["rows"] < statistics[n]["rows"] for n in statistics), (first, statistics)
    for layer in statistics.values():
        assert layer["rows"] > 0 and 0 < layer["max_weight"] <= 1, layer
        assert layer["entropy"] > 0 and layer["logit_std"] > 0, layer
    with pytest.raises(trained_lib.WorkdirError, match="num_examples=0"):
        run.attention_statistics(0)


@pytest.mark.parametrize("name", ["seq2seq_word", "seq2seq_spm"])
def test_evaluate_files_scores_any_text_like_the_split(trained, name, tmp_path):
    from tfjax.inference import evaluation

    path = trained(name)
    run = trained_lib.load(path)
    hypotheses, references, sources = evaluation.decode_dataset(
        run.run, run.params, beam_size=2, alpha=0.6, max_examples=6
    )
    (tmp_path / "src.txt").write_text("".join(f"{line}\n" for line in sources))
    (tmp_path / "ref.txt").write_text("".join(f"{line}\n" for line in references))
    record = evaluator.evaluate_files(
        path, tmp_path / "src.txt", tmp_path / "ref.txt", beam_size=2, max_examples=6
    )
    assert record["split"] == "files" and record["num_examples"] == 6
    assert record["bleu"] == pytest.approx(evaluation.bleu(hypotheses, references))
    assert record["chrf"] == pytest.approx(evaluation.chrf(hypotheses, references))
    assert (path / record["hypotheses"]).read_text().splitlines() == hypotheses
    assert json.loads((path / "eval.json").read_text())["source_file"] == str(tmp_path / "src.txt")
    assert record["hypotheses"].endswith("_beam2_alpha0.6.hyp.txt")
    assert "files_src_step" in record["hypotheses"] and "6 lines" in evaluator.report(record)


def test_evaluate_files_refuses_what_it_cannot_score(trained, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("s1 s2\ns3\n")
    ref.write_text("s2 s1\n")
    with pytest.raises(trained_lib.WorkdirError, match="has 2 lines but reference_file has 1"):
        evaluator.evaluate_files(trained("seq2seq_word"), src, ref)
    with pytest.raises(trained_lib.WorkdirError, match=r"reference_file=.*no\.txt: no such file"):
        evaluator.evaluate_files(trained("seq2seq_word"), src, tmp_path / "no.txt")
    ref.write_text("s2 s1\ns3\n")
    with pytest.raises(trained_lib.WorkdirError, match=r"use python -m experiments\.generate"):
        evaluator.evaluate_files(trained("lm_word"), src, ref)


@pytest.mark.parametrize("name", runs("seq2seq_char", "seq2seq_spm"))
def test_evaluate_greedy_on_other_tokenizers(trained, name):
    record = evaluator.evaluate_workdir(trained(name), max_examples=4)
    assert record["num_examples"] == 4 and 0.0 <= record["bleu"] <= 100.0
    assert record["exact_match"] == record["greedy_exact_match"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_train_resumes_on_every_kind(trained, name, tmp_path):
    # A second run with more steps continues the first: no step twice, same tokenizer file.
    path = tmp_path / name
    shutil.copytree(trained(name), path)
    tokenizer_files = {p.name: p.read_bytes() for p in path.glob("tokenizer.*")}
    spec, overrides = RUNS[name]
    config = config_utils.load_config(spec, [*overrides, "train.num_train_steps=4"])
    trainer.train_and_evaluate(config, path)
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 4, train_steps
    assert {p.name: p.read_bytes() for p in path.glob("tokenizer.*")} == tokenizer_files
    assert trained_lib.load(path).step == 4


def test_evaluate_errors(trained):
    with pytest.raises(trained_lib.WorkdirError, match="beam_size must be >= 1"):
        evaluator.evaluate_workdir(trained("seq2seq_word"), beam_size=0)
    with pytest.raises(trained_lib.WorkdirError, match="max_examples must be >= 0"):
        evaluator.evaluate_workdir(trained("seq2seq_word"), max_examples=-1)


# ---------------------------------------------------------------------------------------------
# Opening a workdir reads only the data the command needs (the tokenizer is saved in it).


def _split_reads(monkeypatch, *, fail: bool = False) -> list[str]:
    """The splits `datasets` reads from now on, in order; `fail`: each read raises instead."""
    reads, read = [], datasets._read

    def spy(source, cfg, fmt, seed, split):
        reads.append(split)
        if fail:
            raise AssertionError(f"split {split!r} read, though the command needs no data")
        return read(source, cfg, fmt, seed, split)

    monkeypatch.setattr(datasets, "_read", spy)
    return reads


def test_decoding_a_workdir_reads_no_data(trained, monkeypatch):
    names = ("seq2seq_word", "lm_char", "classify_spm")
    paths = [trained(name) for name in names]  # trained (reading data) before the spy
    reads = _split_reads(monkeypatch, fail=True)
    translator, generator, classifier = (trained_lib.load(path) for path in paths)
    outputs, _ = translator.translate(["s1 s2 s3", ""], beam_size=2)
    assert len(outputs) == 2 and outputs[1] == ""
    texts, _ = generator.generate(["s1"], max_length=8)
    assert len(texts) == 1
    for loaded, text in ((translator, "s1 s2"), (generator, "s1 s2"), (classifier, "1 0 1")):
        maps, _ = loaded.attention(text)  # what experiments.attention_map draws
        assert maps.weights
    assert reads == []


@pytest.mark.parametrize("split, expected", [(None, ["test"]), ("train", ["train"])])
def test_evaluate_reads_only_the_split_it_scores(trained, monkeypatch, split, expected):
    path = trained("seq2seq_word")
    reads = _split_reads(monkeypatch)
    record = evaluator.evaluate_workdir(path, split=split, beam_size=1, max_examples=4)
    assert reads == expected and record["split"] == expected[0]


# The pairs of the "files" run below: its train and test files hold the same lines.
FILE_PAIRS = "".join(f"s{i} s{i + 1}\ts{i + 1} s{i}\n" for i in range(8))


@pytest.fixture(scope="module")
def data_gone(tmp_path_factory):
    """(workdir, its eval file, overrides): a seq2seq run trained on the TSV files of the
    "files" source, then both files deleted."""
    root = tmp_path_factory.mktemp("files_run")
    train, test = root / "train.tsv", root / "test.tsv"
    for path in (train, test):
        path.write_text(FILE_PAIRS)
    files = ["data.name=files", f"data.train_path={train}", f"data.eval_path={test}"]
    overrides = [*REVERSE, *files]
    config = config_utils.load_config("configs/base.py:tiny", overrides)
    trainer.train_and_evaluate(config, root / "run")
    train.unlink()
    test.unlink()
    return root / "run", test, overrides


def test_a_workdir_whose_data_is_gone_still_translates(data_gone):
    path, test, overrides = data_gone
    outputs, _ = trained_lib.load(path).translate(["s1 s2"], beam_size=1)
    assert len(outputs) == 1
    with pytest.raises(FileNotFoundError, match=f"{test}: no such file"):
        evaluator.evaluate_workdir(path, beam_size=1)  # the split it scores: one line
    # Resuming reads both splits before it trains or writes, even with the train file back.
    train = test.with_name("train.tsv")
    train.write_text(FILE_PAIRS)
    saved = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    more_steps = [*overrides, "train.num_train_steps=4"]
    config = config_utils.load_config("configs/base.py:tiny", more_steps)
    try:
        with pytest.raises(FileNotFoundError, match=f"{test}: no such file"):
            trainer.train_and_evaluate(config, path)
    finally:
        train.unlink()
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == saved


def _damage_tokenizer(path: pathlib.Path, damage: str) -> pathlib.Path:
    """Damages, deletes or replaces the workdir's tokenizer file; returns it."""
    (file,) = path.glob("tokenizer.*")
    if damage == "missing":
        file.unlink()
    elif damage == "empty":
        file.write_bytes(b"")
    else:  # another SentencePiece model, of another corpus
        other = tokenizers.SentencePieceTokenizer.build(["x y z w"] * 9, vocab_size=12)
        other.save(file)
    return file


@pytest.mark.parametrize(
    "name, damage, words",
    [
        ("lm_char", "missing", ["is missing, but the checkpoints in"]),
        ("seq2seq_spm", "empty", ["is not a SentencePiece model: an empty", "put the original"]),
        ("classify_spm", "another", ["is not the tokenizer the checkpoints in", "records"]),
    ],
)
def test_each_command_refuses_a_tokenizer_missing_damaged_or_another(
    trained, tmp_path, name, damage, words
):
    path = tmp_path / name
    shutil.copytree(trained(name), path)
    (path / "eval.json").unlink(missing_ok=True)  # another test may have evaluated the original
    recorded = json.loads((path / "config.json").read_text())["tokenizer_sha256"]
    file = _damage_tokenizer(path, damage)
    words = [str(file), *words, recorded[file.name]]
    # translate and generate open the workdir with `load`, evaluate with `evaluate_workdir`
    for call in (lambda: trained_lib.load(path), lambda: evaluator.evaluate_workdir(path)):
        with pytest.raises(errors.UserError) as info:  # one `error:` line from the commands
            call()
        assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), words
    assert not (path / "eval.json").exists() and (damage == "missing") != file.exists()


# ---------------------------------------------------------------------------------------------
# The commands in subprocesses (slow).


_command = tiny_runs.command


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_evaluate_command(trained, name):
    path = trained(name)
    done = _command("evaluate", f"--workdir={path}", "--beam_size=2")
    assert done.returncode == 0, done.stderr
    saved = json.loads((path / "eval.json").read_text())
    assert "loss" in saved and f"step {saved['step']}" in done.stdout
    if name.startswith("seq2seq"):
        assert saved["beam_size"] == 2 and "tok:13a" in done.stdout


@pytest.mark.slow
def test_evaluate_command_on_files(trained, tmp_path):
    (tmp_path / "src.txt").write_text("s1 s2 s3\ns4 s5\n")
    (tmp_path / "ref.txt").write_text("s3 s2 s1\ns5 s4\n")
    files = [f"--source_file={tmp_path / 'src.txt'}", f"--reference_file={tmp_path / 'ref.txt'}"]
    done = _command("evaluate", f"--workdir={trained('seq2seq_word')}", *files, "--beam_size=1")
    assert done.returncode == 0, done.stderr
    assert "2 lines" in done.stdout and "bleu " in done.stdout and "nrefs:1" in done.stdout
    alone = _command("evaluate", f"--workdir={trained('seq2seq_word')}", files[0])
    assert alone.returncode == 2 and "come together" in alone.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seq2seq_word", "seq2seq_spm", "seq2seq_char"])
def test_translate_command_reads_stdin(trained, name):
    sentence = "s1 s2 s3 s4 s5 s6 s7 s8 s9 s0 s1 s2 s3 s4"  # longer than both models read
    done = _command("translate", f"--workdir={trained(name)}", stdin=f"s1 s2 s3\n\n{sentence}\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == "", done.stdout  # 3 + final newline
    assert "warning: line 2 is empty" in done.stderr
    assert "warning: line 3 has" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seq2seq_word", "lm_char", "classify_spm"])
def test_attention_map_command_draws_one_png_per_layer(trained, name, tmp_path):
    run = trained_lib.load(trained(name))
    text = run.tokenizer.decode(range(4, min(7, run.tokenizer.vocab_size)))
    done = _command(
        "attention_map", f"--workdir={trained(name)}", f"--text={text}", f"--out={tmp_path}"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    pngs = sorted(tmp_path.glob("*.png"))
    assert sorted(map(pathlib.Path, lines[-len(pngs) :])) == pngs  # after the text
    decoder = run.config.model.num_decoder_layers if KIND_OF[name] == "seq2seq" else 0
    assert len(pngs) == run.config.model.num_layers + 2 * decoder
    assert all(p.stat().st_size > 5_000 for p in pngs)
    cross = _command(
        "attention_map", f"--workdir={trained(name)}", f"--text={text}", f"--out={tmp_path}/x",
        "--layers=cross",
    )  # fmt: skip
    assert cross.returncode == 0, cross.stderr
    assert len(list((tmp_path / "x").glob("*.png"))) == decoder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seq2seq_spm", "lm_char"])
def test_attention_map_stats_command_prints_a_line_per_layer(trained, name):
    run = trained_lib.load(trained(name))
    done = _command("attention_map", f"--workdir={trained(name)}", "--stats", "--num_examples=4")
    assert done.returncode == 0, done.stderr
    title, header, *lines = done.stdout.splitlines()
    assert title == f"attention over 4 eval examples, step {run.step}"
    assert header.split() == ["layer", "entropy", "max_weight", "logit_std", "rows"]
    expected = run.attention_statistics(4)
    assert [line.split()[0] for line in lines] == list(expected)
    for line in lines:
        name_, entropy, _, logit_std, rows = line.split()
        assert float(entropy) == pytest.approx(expected[name_]["entropy"], abs=1e-3)
        assert float(logit_std) == pytest.approx(expected[name_]["logit_std"], abs=1e-3)
        assert int(rows) == expected[name_]["rows"]
    bad = _command("attention_map", f"--workdir={trained(name)}", "--stats", "--num_examples=0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --num_examples=0"), bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lm_word", "lm_char", "lm_spm"])
def test_generate_command(trained, name):
    done = _command(
        "generate", f"--workdir={trained(name)}", "--prompt=s1 s2 |", "--prompt=s3 s1 s4 s5 s0 |"
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, name, expected",
    [
        ("evaluate", "empty", "holds no trained run"),
        ("translate", "empty", "python -m experiments.train"),
        ("translate", "lm_word", "use python -m experiments.generate"),
        ("translate", "classify", "use python -m experiments.evaluate"),
        ("generate", "seq2seq_spm", "use python -m experiments.translate"),
        ("attention_map", "seq2seq_word", "--text is empty"),
        ("attention_map", "empty", "holds no trained run"),
    ],
)
def test_commands_fail_clearly(trained, module, name, expected, tmp_path):
    path = tmp_path if name == "empty" else trained(name)
    text = " " if expected.startswith("--text") else "s1 s2"
    args = {"generate": ["--prompt=s1 |"], "attention_map": [f"--text={text}"]}.get(module, [])
    done = _command(module, f"--workdir={path}", *args, stdin="s1\n")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and expected in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, "one line, no traceback"


@pytest.mark.slow
def test_commands_on_a_workdir_whose_data_is_gone(data_gone):
    path, test, _ = data_gone
    done = _command("translate", f"--workdir={path}", "--beam_size=1", stdin="s1 s2\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr
    done = _command("evaluate", f"--workdir={path}", "--beam_size=1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # after evaluate's log lines
    assert last.startswith(f"error: {test}: no such file"), done.stderr
