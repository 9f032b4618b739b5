"""T5 v1.0 and v1.1 checkpoints in tfjax (`tfjax.pretrained.t5`): parity, export, bad input, runs.

Tiny random `T5ForConditionalGeneration`s (`hf_checkpoints.t5`: head width 8 with D 16 and 4
heads, 2 encoder and 3 decoder layers, 8 relative buckets up to distance 6, perturbed norm
scales; v1.0 ReLU with the tied, rescaled output, v1.1 tanh-GELU-gated with an untied lm_head)
and a SentencePiece model trained here are written with `save_pretrained`; nothing is
downloaded. The converted tfjax model must give the PyTorch model's logits to 1e-4 (float32)
with teacher forcing on a batch padded in source and target, the same greedy tokens as
`generate` (tfjax decodes with its KV cache), and the same logits again after export.
"""

import collections
import json
import pathlib
import subprocess
import sys

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from tfjax import models, pretrained
from tfjax.inference import decoding
from tfjax.nn import layers, positional
from tfjax.runs import pretrained as runs_pretrained
from tfjax.runs import trained, trainer
from tfjax.training import logger

transformers = pytest.importorskip(
    "transformers", reason="pretrained-model tests need the 'hf' extra: pip install -e .[hf]"
)
torch = pytest.importorskip("torch", reason="parity tests need the 'parity' extra (torch)")
pytest.importorskip("safetensors.numpy", reason="needs the 'hf' extra")
pytest.importorskip("sentencepiece", reason="the T5 tokenizer is trained with sentencepiece")

import hf_checkpoints  # noqa: E402 (needs transformers and torch)

TOL = {"atol": 1e-4, "rtol": 1e-4}
VERSIONS = tuple(hf_checkpoints.T5_VERSIONS)


@pytest.fixture(scope="module", params=VERSIONS)
def t5_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"t5_{request.param}")
    return directory, hf_checkpoints.t5(directory, request.param), request.param


def _padded(vocab: int, lengths, seed: int):
    """Ids [B, L] (0 on padding) and segment ids (1 = token, 0 = padding), int32."""
    rng = np.random.default_rng(seed)
    segment_ids = (np.arange(max(lengths))[None] < np.array(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(3, vocab, (len(lengths), max(lengths))).astype(np.int32)
    return ids * segment_ids, segment_ids


def _batch(vocab: int):
    """Sources of 9 and 5 tokens (longer than max_distance 6), targets of 7 and 4."""
    inputs, inputs_segment_ids = _padded(vocab, (9, 5), seed=0)
    targets, targets_segment_ids = _padded(vocab, (7, 4), seed=1)
    return inputs, inputs_segment_ids, targets, targets_segment_ids


def _tfjax_logits(config, params, batch):
    inputs, inputs_segment_ids, targets, targets_segment_ids = map(jnp.asarray, batch)
    logits = models.create_model(config).apply(
        {"params": params},
        inputs,
        targets,
        inputs_segment_ids=inputs_segment_ids,
        targets_segment_ids=targets_segment_ids,
    )
    return np.asarray(logits)


def _hf_logits(model, batch):
    """Teacher forcing: the decoder reads the targets shifted right after the start id (pad)."""
    inputs, inputs_segment_ids, targets, targets_segment_ids = map(torch.tensor, batch)
    with torch.no_grad():
        out = model(
            input_ids=inputs.long(),
            attention_mask=inputs_segment_ids.long(),
            decoder_input_ids=model._shift_right(targets.long()),
            decoder_attention_mask=targets_segment_ids.long(),
        )
    return out.logits.numpy()


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 6), (16, 20), (12, 40)])
def test_relative_buckets_equal_hf(bidirectional, num_buckets, max_distance):
    """tfjax's buckets are T5Attention._relative_position_bucket's, far past max_distance."""
    offsets = np.arange(-400, 401)
    ours = positional.relative_position_bucket(
        jnp.asarray(offsets),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        torch.tensor(offsets),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


def test_t5_config_maps_the_architecture(t5_dir):
    directory, hf_model, version = t5_dir
    config, params = pretrained.load_params(directory)
    assert (config.num_layers, config.num_decoder_layers, config.head_dim) == (2, 3, 8)
    assert (config.score, config.positional, config.norm, config.use_bias) == (
        "dot",
        "relative",
        "rmsnorm",
        False,
    )
    assert config.bos_id == hf_model.config.decoder_start_token_id == 0
    untied = version == "v1.1"
    assert (config.tie_output, config.rescale_output) == (not untied, not untied)
    assert config.activation == ("geglu_tanh" if untied else "relu")
    assert ("logits_dense" in params) == untied
    assert params["decoder"]["layer_0"]["self_attention"]["qkv"]["kernel"].shape == (16, 12, 8)


def test_t5_logits_match_hf_on_a_padded_batch(t5_dir):
    directory, hf_model, _ = t5_dir
    config, params = pretrained.load_params(directory)
    batch = _batch(config.vocab_size)
    valid = batch[3] > 0
    ours, theirs = _tfjax_logits(config, params, batch), _hf_logits(hf_model, batch)
    assert np.abs(theirs[valid]).max() > 1.0  # logits of order 1: wrong scales show
    np.testing.assert_allclose(ours[valid], theirs[valid], **TOL)


def test_t5_gated_silu_logits_match_hf(tmp_path):
    """feed_forward_proj="gated-silu" (silu(wi_0 x) * wi_1 x) is tfjax's SwiGLU."""
    hf_model = hf_checkpoints.t5(tmp_path, "v1.1", feed_forward_proj="gated-silu")
    config, params = pretrained.load_params(tmp_path)
    assert config.activation == "swiglu"
    batch = _batch(config.vocab_size)
    valid = batch[3] > 0
    ours, theirs = _tfjax_logits(config, params, batch), _hf_logits(hf_model, batch)
    np.testing.assert_allclose(ours[valid], theirs[valid], **TOL)


def test_t5_without_the_output_rescale_breaks_parity(t5_dir):
    """Negative control: v1.0 without `rescale_output` (v1.1 with it) disagrees."""
    directory, hf_model, _ = t5_dir
    config, params = pretrained.load_params(directory)
    flipped = models.ModelConfig(**{**config.__dict__, "rescale_output": not config.rescale_output})
    batch = _batch(config.vocab_size)
    ours, theirs = _tfjax_logits(flipped, params, batch), _hf_logits(hf_model, batch)
    assert np.abs(ours - theirs)[batch[3] > 0].max() > 1e-2


def _tfjax_dropout_sites(config, params, batch) -> collections.Counter:
    """Dropout calls with a nonzero rate in a training pass, by stack ("encoder", "decoder")."""
    sites = collections.Counter()

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, layers.Dropout) and not kwargs.get("deterministic", True):
            sites[module.path[0]] += module.rate > 0
        return next_fun(*args, **kwargs)

    inputs, inputs_segment_ids, targets, targets_segment_ids = map(jnp.asarray, batch)
    with flax.linen.intercept_methods(record):
        models.create_model(config).apply(
            {"params": params},
            inputs,
            targets,
            inputs_segment_ids=inputs_segment_ids,
            targets_segment_ids=targets_segment_ids,
            deterministic=False,
            rngs={"dropout": jax.random.key(0)},
        )
    return sites


def test_t5_dropout_sits_where_hf_puts_it(t5_dir):
    """Embeddings, each sub-layer's output, the feed-forward's hidden layer, after each final
    norm: the same number of `nn.Dropout` calls per stack in training (attention-probability
    dropout is functional in both, at the same rate)."""
    directory, hf_model, _ = t5_dir
    config, params = pretrained.load_params(directory)
    assert config.attention_dropout_rate == config.dropout_rate == hf_model.config.dropout_rate
    batch = _batch(config.vocab_size)
    theirs = collections.Counter()
    hooks = [
        module.register_forward_hook(lambda *_, n=name: theirs.update([n.split(".")[0]]))
        for name, module in hf_model.named_modules()
        if isinstance(module, torch.nn.Dropout) and module.p > 0
    ]
    hf_model.train()
    try:
        _hf_logits(hf_model, batch)
    finally:
        hf_model.eval()
        for hook in hooks:
            hook.remove()
    assert theirs == {"encoder": 2 + 2 * 3, "decoder": 2 + 3 * 4}  # stack + layers
    assert _tfjax_dropout_sites(config, params, batch) == theirs


def test_t5_greedy_generation_matches_hf_generate(t5_dir):
    directory, hf_model, _ = t5_dir
    config, params = pretrained.load_params(directory)
    inputs, inputs_segment_ids, _, _ = _batch(config.vocab_size)
    new, eos = 10, hf_model.config.eos_token_id
    ours = decoding.generate(
        models.create_model(config),
        params,
        inputs=jnp.asarray(inputs),
        inputs_segment_ids=jnp.asarray(inputs_segment_ids),
        max_length=new,
        eos_id=eos,
    )  # [B, new], 0 after EOS
    with torch.no_grad():
        theirs = hf_model.generate(
            torch.tensor(inputs).long(),
            attention_mask=torch.tensor(inputs_segment_ids).long(),
            do_sample=False,
            num_beams=1,
            max_new_tokens=new,
            use_cache=False,  # transformers sizes its cache by the encoder depth (2, not 3)
        ).numpy()[:, 1:]  # without the start id
    theirs = np.pad(theirs, ((0, 0), (0, new - theirs.shape[1])))  # rows all ended early
    np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_t5_export_round_trips_through_transformers(t5_dir, tmp_path):
    directory, hf_model, _ = t5_dir
    config, params, tokenizer = pretrained.load(directory)
    hf_config = pretrained.read_hf_config(directory)
    pretrained.save(tmp_path, config, params, hf_config=hf_config, tokenizer=tokenizer)
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    hf_checkpoints.assert_same_weights(reloaded, hf_model)
    batch = _batch(config.vocab_size)
    valid = batch[3] > 0
    np.testing.assert_allclose(
        _hf_logits(reloaded, batch)[valid], _tfjax_logits(config, params, batch)[valid], **TOL
    )


def test_t5_tokenizer_appends_eos_and_has_no_bos(t5_dir):
    directory, _, _ = t5_dir
    _, _, tokenizer = pretrained.load(directory)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    text = "The old man reads a newspaper."
    assert tokenizer.encode(text, add_eos=True) == reference(text).input_ids  # ... </s>
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (0, 1, None)
    assert tokenizer.decode(tokenizer.encode(text, add_eos=True)) == reference.decode(
        reference(text).input_ids, skip_special_tokens=True
    )


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the problem.


_copy = hf_checkpoints.edited_copy  # a checkpoint with config.json or weights edited


_load_error = hf_checkpoints.load_error


@pytest.mark.parametrize("proj", ["gated-relu", "gelu", "swish"])
def test_t5_unsupported_feed_forward_is_named(t5_dir, tmp_path, proj):
    directory, _, _ = t5_dir
    edit = lambda c: {**c, "feed_forward_proj": proj}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, config=edit))
    assert f"config.json sets feed_forward_proj={proj!r}, an activation" in message
    assert "supported: relu, gated-gelu, gated-silu" in message


def test_t5_missing_tensor_is_named(t5_dir, tmp_path):
    directory, _, _ = t5_dir
    name = "decoder.block.2.layer.1.EncDecAttention.v.weight"
    drop = lambda w: {k: v for k, v in w.items() if k != name}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, tensors=drop))
    assert f"lacks tensor {name} (for decoder/layer_2/cross_attention/kv/kernel)" in message


def test_t5_shape_mismatch_is_named(t5_dir, tmp_path):
    directory, _, _ = t5_dir
    message = _load_error(_copy(directory, tmp_path, config=lambda c: {**c, "d_kv": 4}))
    assert "has shape [32, 16], but config.json implies [16, 16]" in message


def test_t5_other_architectures_are_refused(t5_dir, tmp_path):
    directory, _, _ = t5_dir
    edit = lambda c: {**c, "architectures": ["T5EncoderModel"]}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, config=edit))
    assert "names architectures ['T5EncoderModel']: tfjax converts" in message


def test_t5_with_a_head_named_says_t5_has_none_to_choose(t5_dir):
    directory, _, _ = t5_dir
    message = _load_error(directory, head="mlm")
    assert "head='mlm': a t5 checkpoint has no mlm head, only its one output layer" in message
    assert "without a head" in message and "None" not in message


def test_t5_untied_encoder_embeddings_are_refused(t5_dir, tmp_path):
    directory, _, _ = t5_dir
    shared = lambda w: {**w, "encoder.embed_tokens.weight": w["shared.weight"] + 1}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, tensors=shared))
    assert "tensor encoder.embed_tokens.weight differs from shared.weight" in message


# ---------------------------------------------------------------------------------------------
# A converted workdir: translate, evaluate, fine-tune.


@pytest.fixture(scope="module")
def converted(t5_dir, tmp_path_factory):
    directory, _, version = t5_dir
    run_dir = tmp_path_factory.mktemp("runs") / f"t5_{version}"
    config = config_utils.load_config("configs/pretrained.py:t5_tiny")
    runs_pretrained.convert(directory, run_dir, config)
    return run_dir


@pytest.mark.slow  # about 20 s per version: conversion, compilation
def test_t5_translate_of_a_converted_workdir_is_hf_generate(t5_dir, converted):
    directory, hf_model, _ = t5_dir
    translator = trained.load(converted, kinds=("encoder_decoder",))
    lines = ["A dog runs across the park.", "Two children play!"]
    ours, _ = translator.translate(lines, beam_size=1, max_length=12)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    with torch.no_grad():
        batch = reference(lines, return_tensors="pt", padding=True)
        ids = hf_model.generate(
            **batch, do_sample=False, num_beams=1, max_new_tokens=12, use_cache=False
        )
    assert ours == reference.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.slow  # about 40 s per version: conversion, 4 steps, export
def test_t5_fine_tuning_from_a_converted_workdir_lowers_the_loss(converted, tmp_path):
    config = config_utils.load_config(
        str(converted / "config.json"), [f"train.init_from={converted}"]
    )
    tuned = tmp_path / "tuned"
    trainer.train_and_evaluate(config, tuned)
    losses = [record["loss"] for record in logger.read_metrics(tuned, "train")]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    runs_pretrained.export(tuned, tmp_path / "exported")
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "exported"))
    params = trained.load(tuned).params
    np.testing.assert_array_equal(
        reloaded.state_dict()["shared.weight"].numpy(), params["embed"]["embedding"]
    )


def _cli(tool: str, *args):
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", f"experiments.{tool}", *args],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        input="A dog runs across the park.\n",
    )


@pytest.mark.slow  # four processes: about a minute
def test_t5_convert_translate_evaluate_and_export_cli(t5_dir, tmp_path):
    directory, _, _ = t5_dir
    run_dir = tmp_path / "run"
    done = _cli("convert", f"--hf_dir={directory}", f"--workdir={run_dir}")
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "config.json").read_text())["data"]["name"] == "copy"
    done = _cli("translate", f"--workdir={run_dir}", "--beam_size=2", "--max_length=8")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr
    done = _cli("evaluate", f"--workdir={run_dir}", "--beam_size=1", "--max_examples=8")
    assert done.returncode == 0, done.stderr
    scores = json.loads((run_dir / "eval.json").read_text())
    assert scores["num_examples"] == 8 and np.isfinite(scores["loss"]) and "bleu" in scores
    done = _cli("convert", "--to_hf", f"--workdir={run_dir}", f"--hf_dir={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr
    assert transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "out"))
