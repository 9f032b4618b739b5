"""A converted checkpoint as a workdir (`tfjax.runs.pretrained`, `experiments.convert`).

A tiny random GPT-2 written with `save_pretrained` is converted into a workdir; the decoding
tools restore it, a run started from it with `train.init_from` lowers the loss, and the
fine-tuned workdir exports back to a directory `transformers` loads with the new weights.
"""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from tfjax import errors, models, pretrained
from tfjax.data import datasets
from tfjax.inference import decoding
from tfjax.runs import pretrained as runs_pretrained
from tfjax.runs import trained, trainer

transformers = pytest.importorskip(
    "transformers", reason="pretrained-model tests need the 'hf' extra: pip install -e .[hf]"
)
torch = pytest.importorskip("torch", reason="parity tests need the 'parity' extra (torch)")

import hf_checkpoints  # noqa: E402 (needs transformers and torch)

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    hf_checkpoints.gpt2(directory)
    return directory


@pytest.fixture(scope="module")
def converted(gpt2_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "gpt2"
    config = config_utils.load_config("configs/pretrained.py:tiny")
    runs_pretrained.convert(gpt2_dir, run_dir, config)
    return run_dir


def test_a_converted_workdir_restores_the_checkpoint(gpt2_dir, converted):
    names = {p.name for p in converted.iterdir()}
    assert {"config.json", "checkpoints", "hf_tokenizer", "hf_config.json"} <= names
    generator = trained.load(converted, kinds=("decoder_only",))
    assert generator.step == 0
    _, params = pretrained.load_params(gpt2_dir)
    jax.tree.map(np.testing.assert_array_equal, generator.params, params)
    texts, _ = generator.generate(["A dog"], max_length=10)
    tokens = generator.tokenizer.encode("A dog")
    expected = decoding.generate(
        models.create_model(generator.run.model_config),
        params,
        prompts=jnp.asarray([tokens], jnp.int32),
        max_length=10,
        eos_id=generator.tokenizer.eos_id,
    )
    assert texts == [generator.tokenizer.decode(np.asarray(expected)[0, len(tokens) :])]


def test_a_converted_workdir_exports_and_generates_without_reading_data(
    converted, tmp_path, monkeypatch
):
    def no_read(*args):
        raise AssertionError("a split was read, though exporting and generating need no data")

    monkeypatch.setattr(datasets, "_read", no_read)
    assert runs_pretrained.export(converted, tmp_path / "exported") == 0
    texts, _ = trained.load(converted).generate(["A dog"], max_length=6)
    assert len(texts) == 1


def test_fine_tuning_from_a_converted_workdir_lowers_the_loss_and_exports(converted, tmp_path):
    spec = str(converted / "config.json")
    config = config_utils.load_config(spec, [f"train.init_from={converted}"])
    tuned = tmp_path / "tuned"
    trainer.train_and_evaluate(config, tuned)
    losses = [
        json.loads(line)["loss"]
        for line in (tuned / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    step = runs_pretrained.export(tuned, tmp_path / "exported")
    assert step == 4
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "exported"))
    params = trained.load(tuned).params
    np.testing.assert_array_equal(
        reloaded.state_dict()["transformer.wte.weight"].numpy(), params["embed"]["embedding"]
    )


def test_init_from_refuses_another_architecture(converted, tmp_path):
    config = config_utils.load_config(
        str(converted / "config.json"), [f"train.init_from={converted}", "model.mlp_dim=32"]
    )
    with pytest.raises(errors.CheckpointError, match=r"model\.mlp_dim: saved 64, now 32"):
        trainer.train_and_evaluate(config, tmp_path / "other")


def test_convert_refuses_a_workdir_that_holds_a_run(gpt2_dir, converted):
    config = config_utils.load_config("configs/pretrained.py:tiny")
    with pytest.raises(errors.WorkdirError, match="already holds a run"):
        runs_pretrained.convert(gpt2_dir, converted, config)


def _convert_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "experiments.convert", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )


def test_convert_cli_gives_one_line_for_another_architecture(gpt2_dir, tmp_path):
    (tmp_path / "llama").mkdir()
    hf_config = json.loads((gpt2_dir / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(
        json.dumps({**hf_config, "model_type": "llama"})
    )
    result = _convert_cli(f"--hf_dir={tmp_path / 'llama'}", f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: model_type 'llama' is not one tfjax converts (supported: gpt2, bert, t5, marian)"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_convert_cli_then_generate_and_evaluate_cli(gpt2_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = _convert_cli(
        f"--hf_dir={gpt2_dir}", f"--workdir={run_dir}", "--config=configs/pretrained.py:tiny"
    )
    assert result.returncode == 0, result.stderr
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    for tool, flags in [("generate", ["--prompt=A dog", "--max_length=10"]), ("evaluate", [])]:
        done = subprocess.run(
            [sys.executable, "-m", f"experiments.{tool}", f"--workdir={run_dir}", *flags],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
        assert done.returncode == 0, done.stderr
    exported = _convert_cli("--to_hf", f"--workdir={run_dir}", f"--hf_dir={tmp_path / 'out'}")
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()
