"""A model kind is one module plus one registration (`tfjax.models.kinds`).

The kind below is registered from this file alone, nothing in tfjax names it, and it goes
through the ordinary roads: `trainer.train_and_evaluate` (what `experiments.train` runs),
`evaluator.evaluate_workdir` (`experiments.evaluate`) and `trained.load(...).generate`
(`experiments.generate`).
"""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import datasets
from tfjax.models import flops, kinds
from tfjax.runs import evaluator, trained, trainer
from tfjax.training import steps

NAME = "toy_soft_lm"


class SoftLM(nn.Module):
    """A decoder-only language model whose logits are halved: a model tfjax does not have."""

    config: models.ModelConfig

    def setup(self):
        self.lm = models.DecoderOnly(self.config)

    def __call__(self, targets, *, targets_segment_ids=None, targets_positions=None, **kw):
        logits = self.lm(
            targets,
            targets_segment_ids=targets_segment_ids,
            targets_positions=targets_positions,
            **kw,
        )
        return 0.5 * logits

    def decode_step(self, tokens, *, positions):
        return 0.5 * self.lm.decode_step(tokens, positions=positions)


def _counts(cfg, source_len, target_len):
    return kinds.Counts(cfg.num_layers * target_len**2, target_len, vocab_output=True)


@pytest.fixture(scope="module")
def toy_kind():
    kind = kinds.register(
        kinds.ModelKind(
            name=NAME,
            model=SoftLM,
            fields=("targets",),
            data_format="lm",
            scores="targets",
            counts=_counts,
            decoding="prompt",
            facade="generator",
            tool="experiments.generate",
            train_example="configs/lm.py:cpu",
        )
    )
    yield kind
    kinds.unregister(NAME)


def _config(kind: str):
    return config_utils.load_config(
        "configs/lm.py:tiny",
        [
            f"model.kind={kind}",
            "train.num_train_steps=2",
            "data.num_train_examples=16",
            "data.num_eval_examples=4",
        ],
    )


def test_a_kind_registered_here_trains_evaluates_and_generates(toy_kind, tmp_path):
    assert kinds.names()[-1] == NAME and NAME in kinds.names(facade="generator")
    trainer.train_and_evaluate(_config(NAME), tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"]["kind"] == NAME

    record = evaluator.evaluate_workdir(tmp_path)
    assert record["step"] == 2 and np.isfinite(record["loss"])

    generator = trained.load(tmp_path, kinds=kinds.names(facade="generator"), tool="test")
    assert type(generator) is trained.Generator and type(generator.run.model) is SoftLM
    texts, _ = generator.generate(["s1 s2 |", "s3 |"], max_length=12)
    assert len(texts) == 2 and all(isinstance(text, str) for text in texts)


def test_the_record_is_what_the_layers_read(toy_kind):
    """The toy's record answers as a decoder-only one does, through the same questions."""
    config = models.ModelConfig(
        kind=NAME, vocab_size=11, embed_dim=8, num_layers=1, num_heads=2, mlp_dim=16
    )
    model = models.create_model(config)
    batch = {"targets": jnp.ones((2, 5), jnp.int32), "targets_segment_ids": jnp.ones((2, 5))}
    args, kwargs = steps.model_inputs(batch, NAME)
    assert len(args) == 1 and set(kwargs) == {"targets_segment_ids"}
    init = lambda *a: model.init(jax.random.key(0), *a)["params"]  # noqa: E731
    params = jax.eval_shape(init, *args)
    lm_config = dataclasses.replace(config, kind="decoder_only")
    assert flops.train_flops(config, params, batch=2, source_len=0, target_len=5) == (
        flops.train_flops(lm_config, params["lm"], batch=2, source_len=0, target_len=5)
    )
    assert toy_kind.example_format("mlm") == "lm" and toy_kind.lengths == ("max_target_len",)
    reverse = datasets.DataConfig(name="reverse")  # pairs: the kinds of seq2seq and lm data
    with pytest.raises(ValueError, match=rf"which train encoder_decoder or decoder_only or {NAME}"):
        datasets.load(reverse, kinds.get("encoder_only"), seed=0)


def test_registration_is_checked():
    with pytest.raises(errors.ConfigError, match=r"model.kind='nope' is not one of"):
        kinds.get("nope")
    with pytest.raises(ValueError, match=r"already registered"):
        kinds.register(kinds.get("decoder_only"))
    bad = dict(kinds.get("decoder_only").__dict__, name="x", facade="window")
    with pytest.raises(ValueError, match=r"facade='window'"):
        kinds.register(kinds.ModelKind(**bad))
