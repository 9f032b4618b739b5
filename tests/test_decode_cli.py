"""Tests of the decoding entry points: experiments.evaluate, translate and generate.

Two tiny workdirs are trained once per module, in-process: an encoder-decoder
(`configs/base.py:tiny` on the small `reverse` task, whose eval split decodes in seconds) and a
decoder-only LM (`configs/lm.py:tiny`). The commands' functions are tested in-process; the
tests that start `python -m experiments.*` subprocesses are marked slow.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from experiments import config_utils, evaluate, generate, translate
from tfjax.data import tokenizers
from tfjax.runs import trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEQ2SEQ_OVERRIDES = [
    "train.num_train_steps=2",
    "data.name=reverse",
    "data.num_train_examples=64",
    "data.num_eval_examples=10",
    "data.task_max_len=6",
    "data.max_source_len=8",
    "data.max_target_len=8",
]
LONG_LINE = " ".join(f"s{i % 10}" for i in range(12))  # 12 words; the model reads 7 (+ EOS)


@pytest.fixture(scope="module")
def seq2seq_workdir(tmp_path_factory) -> pathlib.Path:
    workdir = tmp_path_factory.mktemp("seq2seq")
    config = config_utils.load_config("configs/base.py:tiny", SEQ2SEQ_OVERRIDES)
    trainer.train_and_evaluate(config, workdir)
    return workdir


@pytest.fixture(scope="module")
def lm_workdir(tmp_path_factory) -> pathlib.Path:
    workdir = tmp_path_factory.mktemp("lm")
    config = config_utils.load_config("configs/lm.py:tiny", ["train.num_train_steps=2"])
    trainer.train_and_evaluate(config, workdir)
    return workdir


def _restore(workdir, kind):
    run, restored = evaluate.restore_workdir(workdir, tool="test", kinds=(kind,))
    return run, restored.state.params


# ---------------------------------------------------------------------------------------------
# evaluate


def test_evaluate_writes_scores_and_hypotheses(seq2seq_workdir):
    record = evaluate.evaluate_workdir(seq2seq_workdir, beam_size=1)
    saved = json.loads((seq2seq_workdir / "eval.json").read_text())
    assert saved == record
    assert {"bleu", "chrf", "exact_match", "loss", "perplexity", "accuracy"} <= set(saved)
    assert saved["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert (saved["split"], saved["step"], saved["beam_size"]) == ("test", 2, 1)
    hypotheses = (seq2seq_workdir / saved["hypotheses"]).read_text().splitlines()
    assert saved["hypotheses"] == "eval/test_step2_beam1.hyp.txt"
    assert len(hypotheses) == saved["num_examples"] == 10
    # The cached greedy decoder agrees with the trainer's uncached one.
    assert saved["exact_match"] == saved["greedy_exact_match"]
    assert (seq2seq_workdir / "eval" / "test_step2_beam1.json").exists()


def test_evaluate_beam_search_and_train_split(seq2seq_workdir):
    record = evaluate.evaluate_workdir(seq2seq_workdir, split="train", beam_size=2, max_examples=3)
    assert (record["split"], record["beam_size"], record["num_examples"]) == ("train", 2, 3)
    assert (seq2seq_workdir / "eval" / "train_step2_beam2.hyp.txt").exists()
    assert 0.0 <= record["bleu"] <= 100.0


def test_evaluate_lm_reports_teacher_forced_metrics(lm_workdir):
    record = evaluate.evaluate_workdir(lm_workdir)
    assert {"loss", "accuracy", "perplexity"} <= set(record)
    assert "bleu" not in record and "beam_size" not in record
    assert json.loads((lm_workdir / "eval.json").read_text()) == record


def test_evaluate_errors(seq2seq_workdir, tmp_path):
    with pytest.raises(evaluate.CommandError, match="choose one of test, train"):
        evaluate.evaluate_workdir(seq2seq_workdir, split="valid")
    with pytest.raises(evaluate.CommandError, match="--beam_size must be >= 1"):
        evaluate.evaluate_workdir(seq2seq_workdir, beam_size=0)
    with pytest.raises(evaluate.CommandError, match=r"holds no trained run.*experiments\.train"):
        evaluate.evaluate_workdir(tmp_path)


def test_config_without_checkpoint_names_the_train_command(seq2seq_workdir, tmp_path):
    shutil.copy(seq2seq_workdir / "config.json", tmp_path / "config.json")
    with pytest.raises(evaluate.CommandError, match=r"holds no checkpoint.*experiments\.train"):
        evaluate.restore_workdir(tmp_path, tool="test", kinds=("encoder_decoder",))


# ---------------------------------------------------------------------------------------------
# translate


def test_encode_lines_truncates_and_warns():
    tokenizer = tokenizers.WordTokenizer.build(["a b c d"])
    lines = ["a b", "", "a b c d a b", "a zz b yy", "zz"]
    encoded, warnings = translate.encode_lines(lines, tokenizer, max_source_len=4)
    a, b, c = (tokenizer.encode(w)[0] for w in "abc")
    eos, unk = tokenizers.EOS_ID, tokenizers.UNK_ID
    expected = [[a, b, eos], None, [a, b, c, eos], [a, unk, b, eos], [unk, eos]]
    assert encoded == expected
    assert len(warnings) == 4  # empty line 2, long lines 3 and 4, unknown words once (line 4)
    assert "line 2 is empty" in warnings[0]
    assert "line 3 has 6 words" in warnings[1] and "first 3 words" in warnings[1]
    assert "line 4: yy, zz not in the model's vocabulary" in warnings[2]
    assert "line 4 has 4 words" in warnings[3]


def test_translate_lines_keeps_one_output_per_line(seq2seq_workdir):
    run, params = _restore(seq2seq_workdir, "encoder_decoder")
    outputs, warnings = translate.translate_lines(
        run, params, ["s1 s2 s3", "", LONG_LINE], beam_size=1
    )
    assert len(outputs) == 3 and outputs[1] == ""
    assert any("line 2 is empty" in w for w in warnings)
    assert any("line 3 has 12 words" in w for w in warnings)
    truncated, _ = translate.translate_lines(
        run, params, [" ".join(LONG_LINE.split()[:7])], beam_size=1
    )
    assert truncated == outputs[2:]


def test_translate_refuses_a_decoder_only_workdir(lm_workdir):
    with pytest.raises(evaluate.CommandError, match=r"experiments\.generate"):
        evaluate.restore_workdir(lm_workdir, tool=translate.TOOL, kinds=("encoder_decoder",))


# ---------------------------------------------------------------------------------------------
# generate


def test_encode_prompts_pads_right():
    tokenizer = tokenizers.WordTokenizer.build(["a b |"])
    tokens, lengths, warnings = generate.encode_prompts(["a |", "b a b |", "a q"], tokenizer, 8)
    assert tokens.shape == (3, 4) and lengths.tolist() == [2, 4, 2]
    assert tokens[0, 2:].tolist() == [0, 0]
    assert warnings == ["prompt 3: q not in the model's vocabulary, read as <unk>"]
    chars = tokenizers.CharTokenizer.build(["ab ba"])
    assert generate.encode_prompts(["ab a", "b ax"], chars, 8)[2] == [
        "prompt 2: ax not in the model's vocabulary, read as <unk>"
    ]
    with pytest.raises(evaluate.CommandError, match="prompt 2 has 4 words"):
        generate.encode_prompts(["a", "a b a b"], tokenizer, 4)
    with pytest.raises(evaluate.CommandError, match="no prompt"):
        generate.encode_prompts([], tokenizer, 4)


def test_generate_batches_prompts_of_different_lengths(lm_workdir):
    run, params = _restore(lm_workdir, "decoder_only")
    prompts = ["s1 s2 |", "s3 s1 s4 s5 s0 |"]
    outputs, warnings = generate.generate_texts(run, params, prompts)
    assert len(outputs) == 2 and not warnings
    # Padding one prompt to the other's length changes nothing: each alone gives the same.
    assert [generate.generate_texts(run, params, [p])[0][0] for p in prompts] == outputs
    sampled, _ = generate.generate_texts(run, params, prompts, temperature=1.0, top_k=3, seed=1)
    assert len(sampled) == 2
    # Past the trained length a window slides on; up to it the text is the cached one.
    longer, _ = generate.generate_texts(
        run, params, prompts, max_length=run.config.data.max_target_len + 6
    )
    assert all(a.startswith(b) for a, b in zip(longer, outputs, strict=True))
    too_long = " ".join(["s1"] * run.config.data.max_target_len)
    with pytest.raises(evaluate.CommandError, match="trained length"):
        generate.generate_texts(run, params, [too_long], max_length=1000)
    with pytest.raises(evaluate.CommandError, match="--top_p"):
        generate.generate_texts(run, params, prompts, top_p=0.0)


def test_generate_refuses_an_encoder_decoder_workdir(seq2seq_workdir):
    with pytest.raises(evaluate.CommandError, match=r"experiments\.translate"):
        evaluate.restore_workdir(seq2seq_workdir, tool=generate.TOOL, kinds=("decoder_only",))


# ---------------------------------------------------------------------------------------------
# The commands in subprocesses (slow).


def _command(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one CPU device, as on a user's machine
    return subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_evaluate_command(seq2seq_workdir):
    done = _command("evaluate", f"--workdir={seq2seq_workdir}", "--beam_size=2")
    assert done.returncode == 0, done.stderr
    saved = json.loads((seq2seq_workdir / "eval.json").read_text())
    assert {"bleu", "chrf", "exact_match"} <= set(saved) and saved["beam_size"] == 2
    assert "bleu" in done.stdout and "tok:13a" in done.stdout


@pytest.mark.slow
def test_translate_command_reads_stdin(seq2seq_workdir):
    done = _command("translate", f"--workdir={seq2seq_workdir}", stdin=f"s1 s2 s3\n\n{LONG_LINE}\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == "", done.stdout  # 3 + final newline
    assert "warning: line 2 is empty" in done.stderr
    assert "warning: line 3 has 12 words" in done.stderr


@pytest.mark.slow
def test_generate_command(lm_workdir):
    done = _command(
        "generate", f"--workdir={lm_workdir}", "--prompt=s1 s2 |", "--prompt=s3 s1 s4 s5 s0 |"
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, workdir, expected",
    [
        ("evaluate", "empty", "holds no trained run"),
        ("translate", "empty", "python -m experiments.train"),
        ("translate", "lm", "use python -m experiments.generate"),
        ("generate", "seq2seq", "use python -m experiments.translate"),
    ],
)
def test_commands_fail_clearly(module, workdir, expected, seq2seq_workdir, lm_workdir, tmp_path):
    path = {"empty": tmp_path, "lm": lm_workdir, "seq2seq": seq2seq_workdir}[workdir]
    args = ["--prompt=s1 |"] if module == "generate" else []
    done = _command(module, f"--workdir={path}", *args, stdin="s1\n")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and expected in done.stderr, done.stderr
