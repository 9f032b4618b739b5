"""What a conversion checks beyond the weights: the tokenizer's size, BERT's problem type, the
data lengths a learned position table covers, and the length limits a converted workdir takes
from its checkpoint (`tfjax.pretrained.load_tokenizer`, `bert.model_config`,
`validation.check_config`, `runs.pretrained.data_lengths`).

Tiny random checkpoints are built here (`hf_checkpoints`); nothing is downloaded.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from experiments import config_utils
from tfjax import errors, pretrained
from tfjax.pretrained import bert, t5
from tfjax.runs import pretrained as runs_pretrained
from tfjax.runs import validation

transformers = pytest.importorskip(
    "transformers", reason="pretrained-model tests need the 'hf' extra: pip install -e .[hf]"
)
torch = pytest.importorskip("torch", reason="the checkpoints are written with torch")
pytest.importorskip("safetensors.numpy", reason="needs the 'hf' extra")
pytest.importorskip("sentencepiece", reason="the T5 tokenizer is trained with sentencepiece")

import hf_checkpoints  # noqa: E402 (needs transformers and torch)

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json")


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("t5")
    hf_checkpoints.t5(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    hf_checkpoints.gpt2(directory)  # 24 positions
    return directory


def _model_only(directory: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """A copy of the checkpoint without its tokenizer's files."""
    target.mkdir()
    for name in MODEL_FILES:
        shutil.copyfile(directory / name, target / name)
    return target


def _with_vocab_size(directory: pathlib.Path, target: pathlib.Path, rows: int) -> pathlib.Path:
    """A copy of the checkpoint whose config.json says the table has `rows` rows."""
    shutil.copytree(directory, target)
    hf = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**hf, "vocab_size": rows}))
    return target


# ---------------------------------------------------------------------------------------------
# The tokenizer must be the model's.


@pytest.mark.slow  # 4.5 s; the refusal's code runs in the default tier for the other families
def test_a_t5_without_its_tokenizer_files_is_refused_by_convert_in_one_line(t5_dir, tmp_path):
    """transformers makes up a 104-id T5 tokenizer from config.json alone; the model has 63."""
    bare = _model_only(t5_dir, tmp_path / "bare")
    assert len(transformers.AutoTokenizer.from_pretrained(str(bare))) == 104  # the placeholder
    done = subprocess.run(
        [
            *(sys.executable, "-m", "experiments.convert"),
            *(f"--hf_dir={bare}", f"--workdir={tmp_path / 'run'}"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]
    assert lines[-1] == (
        f"error: {bare}: the tokenizer has 104 ids but the t5 model's embedding table has 63 "
        "rows (config.json vocab_size), so it is not the checkpoint's tokenizer (are its files "
        f"missing?): copy the checkpoint's tokenizer files (spiece.model / tokenizer.json) into "
        f"{bare}"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rows", [63, 64, 128])
def test_a_table_padded_up_to_a_multiple_of_128_fits_the_tokenizer(t5_dir, tmp_path, rows):
    """63 ids in 63 rows, or in rows padded up to 128 (as T5's 32,100 ids in 32,128 rows)."""
    tokenizer = pretrained.load_tokenizer(_with_vocab_size(t5_dir, tmp_path / "t5", rows))
    assert tokenizer.vocab_size == 63


@pytest.mark.parametrize("rows", [62, 129, 225])
def test_a_table_of_another_size_than_the_tokenizer_is_refused(t5_dir, tmp_path, rows):
    with pytest.raises(errors.DataError) as info:
        pretrained.load_tokenizer(_with_vocab_size(t5_dir, tmp_path / "t5", rows))
    assert f"the tokenizer has 63 ids but the t5 model's embedding table has {rows} rows" in (
        str(info.value)
    )


def test_another_familys_tokenizer_is_refused(gpt2_dir, tmp_path):
    """A GPT-2 checkpoint holding a BERT tokenizer (another size) instead of its own."""
    target = shutil.copytree(gpt2_dir, tmp_path / "gpt2")
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        (target / name).unlink(missing_ok=True)
    hf_checkpoints.bert_tokenizer(target)
    rows = json.loads((target / "config.json").read_text())["vocab_size"]
    with pytest.raises(errors.DataError, match=f"embedding table has {rows} rows") as info:
        pretrained.load(target)
    assert "vocab.json / merges.txt" in str(info.value)


# ---------------------------------------------------------------------------------------------
# BERT classifiers: transformers' problem types.


def _bert_config(**fields) -> dict:
    return transformers.BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=32,
        architectures=["BertForSequenceClassification"],
        **fields,
    ).to_dict()


@pytest.mark.parametrize(
    "fields, expected",
    [
        (
            dict(num_labels=4, problem_type="multi_label_classification"),
            "classifier is a multi_label_classification model (problem_type="
            "'multi_label_classification', 4 labels), which transformers trains with a sigmoid "
            "cross-entropy per label",
        ),
        (
            dict(num_labels=3, problem_type="regression"),
            "a regression model (problem_type='regression', 3 labels)",
        ),
        (dict(num_labels=1), "a regression model (problem_type=None, 1 labels)"),
    ],
)
def test_a_bert_classifier_trained_with_another_loss_is_refused(fields, expected):
    with pytest.raises(errors.ConversionError) as info:
        pretrained.model_config(_bert_config(**fields))
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert "tfjax's classify head trains single_label_classification only" in str(info.value)


@pytest.mark.parametrize("problem_type", [None, "single_label_classification"])
def test_a_single_label_bert_classifier_converts(problem_type):
    config = pretrained.model_config(_bert_config(num_labels=3, problem_type=problem_type))
    assert (config.encoder_head, config.num_classes) == ("classify", 3)


def test_an_unknown_problem_type_is_refused():
    hf = {**_bert_config(num_labels=3), "problem_type": "ranking"}
    with pytest.raises(errors.ConversionError, match="problem_type='ranking', which"):
        bert.model_config(hf)


def test_the_mlm_head_ignores_the_problem_type():
    hf = _bert_config(num_labels=3, problem_type="multi_label_classification")
    assert bert.model_config(hf, "mlm").encoder_head == "mlm"


# ---------------------------------------------------------------------------------------------
# A learned position table covers the data's lengths.


@pytest.mark.parametrize(
    "preset, overrides, key, length",
    [
        ("tiny", ["data.max_target_len=256"], "max_target_len", 256),  # GPT-2 style
        ("tiny_seq2seq", ["data.max_source_len=129"], "max_source_len", 129),
        ("tiny_seq2seq", ["data.max_target_len=200"], "max_target_len", 200),
        ("encoder_only", ["data.max_source_len=130"], "max_source_len", 130),  # BERT style
    ],
)
def test_a_data_length_past_a_learned_position_table_is_refused(preset, overrides, key, length):
    table = ["model.positional=learned", "model.max_len=128"]
    config = config_utils.load_config(f"configs/pretrained.py:{preset}", table + overrides)
    with pytest.raises(errors.ConfigError) as info:
        validation.check_config(config)
    assert str(info.value) == (
        f"data.{key}={length} is longer than the model's learned position table "
        f"(model.max_len=128 positions): set data.{key} <= 128"
    )


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rotary"])
def test_data_lengths_up_to_the_table_or_without_one_are_accepted(positional):
    lengths = ["data.max_source_len=128", "data.max_target_len=128", "model.max_len=128"]
    config = config_utils.load_config(
        "configs/pretrained.py:tiny_seq2seq", [f"model.positional={positional}", *lengths]
    )
    validation.check_config(config)
    if positional != "learned":  # no table: any length
        longer = config_utils.load_config(
            "configs/pretrained.py:tiny_seq2seq",
            [f"model.positional={positional}", "model.max_len=16", *lengths[:2]],
        )
        validation.check_config(longer)


def test_convert_refuses_an_explicit_length_past_gpt2s_positions(gpt2_dir, tmp_path):
    config = config_utils.load_config("configs/pretrained.py:tiny", ["data.max_target_len=32"])
    with pytest.raises(errors.ConfigError, match=r"data.max_target_len=32 .* <= 24"):
        runs_pretrained.convert(
            gpt2_dir, tmp_path / "run", config, explicit={"data.max_target_len"}
        )
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Length limits from the checkpoint.


def test_convert_cuts_a_presets_length_to_gpt2s_positions(gpt2_dir):
    config = config_utils.load_config("configs/pretrained.py:tiny")  # max_target_len 64
    model_config = pretrained.model_config(pretrained.read_hf_config(gpt2_dir))
    assert runs_pretrained.data_lengths(config, model_config, 24) == {"data.max_target_len": 24}
    config = config_utils.load_config("configs/pretrained.py:tiny", ["data.max_target_len=16"])
    assert runs_pretrained.data_lengths(config, model_config, 24) == {"data.max_target_len": 16}


def test_t5_takes_the_tokenizers_model_max_length_else_512(t5_dir, tmp_path):
    hf = pretrained.read_hf_config(t5_dir)
    assert t5.length_limit(t5_dir, hf) == 512  # model_max_length unset: transformers' 1e30
    target = shutil.copytree(t5_dir, tmp_path / "t5")
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 100
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert t5.length_limit(target, hf) == 100
    assert pretrained.load_tokenizer(target).vocab_size == 63


@pytest.mark.slow
def test_convert_writes_the_t5_checkpoints_limits_unless_given(t5_dir, tmp_path):
    config = config_utils.load_config("configs/pretrained.py:t5_tiny")  # 32 and 64
    written = runs_pretrained.convert(t5_dir, tmp_path / "run", config)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["data"]
    assert (saved["max_source_len"], saved["max_target_len"]) == (512, 512)
    assert (written.data.max_source_len, written.data.max_target_len) == (512, 512)
    given = config_utils.load_config("configs/pretrained.py:t5_tiny", ["data.max_source_len=40"])
    written = runs_pretrained.convert(
        t5_dir, tmp_path / "given", given, explicit={"data.max_source_len"}
    )
    assert (written.data.max_source_len, written.data.max_target_len) == (40, 512)
