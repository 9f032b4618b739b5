"""Hugging Face checkpoints in tfjax (`tfjax.pretrained`): GPT-2 parity, export, bad input.

Tiny random checkpoints are built here with `transformers` and `save_pretrained`
(`hf_checkpoints`); nothing is downloaded. The tfjax model converted from one must give the HF
PyTorch model's logits to 1e-4 (float32) on a padded batch and the same greedy continuation as
`generate`; exported back, `transformers` must load it and give the same logits. Each wrong
input must fail in one line that names the problem.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import errors, models, pretrained
from tfjax.inference import decoding
from tfjax.pretrained import checkpoint, gpt2

transformers = pytest.importorskip(
    "transformers", reason="pretrained-model tests need the 'hf' extra: pip install -e .[hf]"
)
torch = pytest.importorskip("torch", reason="parity tests need the 'parity' extra (torch)")
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="needs the 'hf' extra")

import hf_checkpoints  # noqa: E402 (needs transformers and torch)

TOL = {"atol": 1e-4, "rtol": 1e-4}
LENGTHS = (7, 4)  # a padded batch: row 1 has 4 tokens, then padding


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    return directory, hf_checkpoints.gpt2(directory)


def _padded_batch(vocab: int, lengths=LENGTHS, seed: int = 0):
    """Token ids [B, L] (0 on padding) and segment ids (1 = token, 0 = padding), int32."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    segment_ids = (np.arange(width)[None] < np.array(lengths)[:, None]).astype(np.int32)
    return rng.integers(0, vocab - 1, (len(lengths), width)).astype(
        np.int32
    ) * segment_ids, segment_ids


def _tfjax_lm_logits(config, params, targets, segment_ids):
    model = models.create_model(config)
    logits = model.apply(
        {"params": params}, jnp.asarray(targets), targets_segment_ids=jnp.asarray(segment_ids)
    )
    return np.asarray(logits)


def _hf_lm_logits(model, targets, segment_ids, bos: int):
    """HF logits of the same predictions: inputs are BOS + targets[:-1] (tfjax's shift right)."""
    inputs = np.concatenate([np.full((len(targets), 1), bos), targets[:, :-1]], axis=1)
    with torch.no_grad():
        out = model(torch.tensor(inputs).long(), attention_mask=torch.tensor(segment_ids).long())
    return out.logits.numpy()


def test_gpt2_logits_match_hf_on_a_padded_batch(gpt2_dir):
    directory, hf_model = gpt2_dir
    config, params = pretrained.load_params(directory)
    targets, segment_ids = _padded_batch(config.vocab_size)
    ours = _tfjax_lm_logits(config, params, targets, segment_ids)
    theirs = _hf_lm_logits(hf_model, targets, segment_ids, config.bos_id)
    valid = segment_ids > 0
    np.testing.assert_allclose(ours[valid], theirs[valid], **TOL)


def test_gpt2_greedy_generation_matches_hf_generate(gpt2_dir):
    directory, hf_model = gpt2_dir
    config, params = pretrained.load_params(directory)
    prompts = np.array([[5, 9, 13], [40, 2, 77]], np.int32)
    new = 8
    ours = decoding.generate(
        models.create_model(config),
        params,
        prompts=jnp.asarray(prompts),
        max_length=prompts.shape[1] + new,
        eos_id=hf_model.config.eos_token_id,
    )
    inputs = np.concatenate([np.full((2, 1), config.bos_id), prompts], axis=1)
    with torch.no_grad():
        theirs = hf_model.generate(
            torch.tensor(inputs).long(),
            attention_mask=torch.ones(inputs.shape, dtype=torch.long),
            do_sample=False,
            max_new_tokens=new,
            pad_token_id=config.bos_id,
            eos_token_id=hf_model.config.eos_token_id,
        ).numpy()
    np.testing.assert_array_equal(
        np.asarray(ours)[:, prompts.shape[1] :], theirs[:, inputs.shape[1] :]
    )


def test_gpt2_export_round_trips_through_transformers(gpt2_dir, tmp_path):
    directory, hf_model = gpt2_dir
    config, params, tokenizer = pretrained.load(directory)
    pretrained.save(
        tmp_path,
        config,
        params,
        hf_config=pretrained.read_hf_config(directory),
        tokenizer=tokenizer,
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(reloaded) is type(hf_model)
    hf_checkpoints.assert_same_weights(reloaded, hf_model)
    targets, segment_ids = _padded_batch(config.vocab_size)
    valid = segment_ids > 0
    np.testing.assert_allclose(
        _hf_lm_logits(reloaded, targets, segment_ids, config.bos_id)[valid],
        _tfjax_lm_logits(config, params, targets, segment_ids)[valid],
        **TOL,
    )
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode(
        "A dog"
    ) == tokenizer.encode("A dog")


def test_gpt2_tokenizer_is_the_checkpoints(gpt2_dir):
    directory, _ = gpt2_dir
    _, _, tokenizer = pretrained.load(directory)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    text = "Two children play with a red ball!"
    ids = tokenizer.encode(text, add_eos=True)
    assert ids == [*reference.encode(text), reference.eos_token_id]
    assert tokenizer.eos_id == tokenizer.bos_id == reference.eos_token_id  # <|endoftext|>
    assert tokenizer.decode([*ids, 5, 6]) == text  # stops at EOS
    assert tokenizer.pieces([ids[0], tokenizer.eos_id]) == [
        reference.convert_ids_to_tokens(ids[0]),
        "<|endoftext|>",
    ]


def test_a_transposed_projection_breaks_parity(gpt2_dir, monkeypatch):
    """Negative control: reading c_proj [in, out] as torch's [out, in] must change the logits."""
    directory, hf_model = gpt2_dir
    table = gpt2.table

    def transposed(cfg):
        return [
            checkpoint.Entry(e.path, e.names, e.shapes, "linear")
            if e.names[0].endswith("attn.c_proj.weight")
            else e
            for e in table(cfg)
        ]

    monkeypatch.setattr(gpt2, "table", transposed)
    config, params = pretrained.load_params(directory)
    targets, segment_ids = _padded_batch(config.vocab_size)
    ours = _tfjax_lm_logits(config, params, targets, segment_ids)
    theirs = _hf_lm_logits(hf_model, targets, segment_ids, config.bos_id)
    assert np.abs(ours - theirs)[segment_ids > 0].max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Bad input: one line naming the problem.


_copy = hf_checkpoints.edited_copy  # a checkpoint with config.json or weights edited


_load_error = hf_checkpoints.load_error


def test_another_architecture_is_refused(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    message = _load_error(_copy(directory, tmp_path, config=lambda c: {**c, "model_type": "llama"}))
    assert "model_type 'llama' is not one tfjax converts" in message
    assert "is a 'gpt2' model, not 'bert'" in _load_error(directory, family_name="bert")


def test_a_missing_tensor_is_named(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    drop = lambda w: {k: v for k, v in w.items() if k != "transformer.h.1.mlp.c_fc.bias"}  # noqa: E731
    assert "lacks tensor h.1.mlp.c_fc.bias" in _load_error(_copy(directory, tmp_path, tensors=drop))


def test_an_unknown_tensor_is_named(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    extra = lambda w: {**w, "transformer.h.0.attn.rotary.inv_freq": np.ones(4, np.float32)}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, tensors=extra))
    assert "tensor h.0.attn.rotary.inv_freq (of 1 unused) has no place" in message


def test_a_shape_mismatch_is_named(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    message = _load_error(_copy(directory, tmp_path, config=lambda c: {**c, "n_inner": 32}))
    assert (
        "tensor h.0.mlp.c_fc.weight has shape [16, 64], but config.json implies [16, 32]" in message
    )


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("activation_function", "quick_gelu", "activation_function='quick_gelu', an activation"),
        ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True, which"),
        ("tie_word_embeddings", False, "tie_word_embeddings=False, which"),
    ],
)
def test_an_unsupported_option_is_named(gpt2_dir, tmp_path, option, value, expected):
    directory, _ = gpt2_dir
    assert expected in _load_error(
        _copy(directory, tmp_path, config=lambda c: {**c, option: value})
    )


def test_an_untied_copy_of_the_embeddings_is_refused(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir

    def untied(weights):
        wte = weights["transformer.wte.weight"]
        return {**weights, "lm_head.weight": wte + 1.0}

    message = _load_error(_copy(directory, tmp_path, tensors=untied))
    assert "tensor lm_head.weight differs from wte.weight" in message


def test_a_tied_copy_equal_to_the_embeddings_is_accepted(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    tied = lambda w: {**w, "lm_head.weight": w["transformer.wte.weight"]}  # noqa: E731
    _, params = pretrained.load_params(_copy(directory, tmp_path, tensors=tied))
    assert params["embed"]["embedding"].shape[1] == 16


def test_export_refuses_another_architecture(gpt2_dir, tmp_path):
    directory, _ = gpt2_dir
    config, params = pretrained.load_params(directory)
    wider = models.ModelConfig(**{**config.__dict__, "mlp_dim": 32})
    with pytest.raises(errors.ConversionError, match="mlp_dim=32, but the checkpoint's config"):
        pretrained.save(tmp_path, wider, params, hf_config=pretrained.read_hf_config(directory))


def test_scanned_parameters_export_like_unscanned_ones(gpt2_dir, tmp_path):
    from tfjax.nn import stacking

    directory, _ = gpt2_dir
    config, params = pretrained.load_params(directory)
    scanned = models.ModelConfig(**{**config.__dict__, "scan_layers": True})
    stacked = stacking.convert_layout(jax.tree.map(jnp.asarray, params), scan=True)
    pretrained.save(tmp_path, scanned, stacked, hf_config=pretrained.read_hf_config(directory))
    _, reread = pretrained.load_params(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, reread, params)


# ---------------------------------------------------------------------------------------------
# BERT: masked-LM and classification heads.


@pytest.fixture(scope="module", params=["mlm", "classify"])
def bert_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(f"bert_{request.param}")
    return directory, hf_checkpoints.bert(directory, request.param), request.param


def _encoder_logits(config, params, inputs, segment_ids):
    model = models.create_model(config)
    return np.asarray(
        model.apply(
            {"params": params}, jnp.asarray(inputs), inputs_segment_ids=jnp.asarray(segment_ids)
        )
    )


def _hf_encoder_logits(model, inputs, segment_ids):
    with torch.no_grad():
        out = model(torch.tensor(inputs).long(), attention_mask=torch.tensor(segment_ids).long())
    return out.logits.numpy()


def _valid_rows(logits, segment_ids):
    """MLM logits at real positions; classification logits as they are."""
    return logits[segment_ids > 0] if logits.ndim == 3 else logits


def test_bert_logits_match_hf_on_a_padded_batch(bert_dir):
    directory, hf_model, head = bert_dir
    config, params = pretrained.load_params(directory)
    assert config.encoder_head == head
    inputs, segment_ids = _padded_batch(config.vocab_size)
    ours = _encoder_logits(config, params, inputs, segment_ids)
    theirs = _hf_encoder_logits(hf_model, inputs, segment_ids)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(
        _valid_rows(ours, segment_ids), _valid_rows(theirs, segment_ids), **TOL
    )


def test_bert_export_round_trips_through_transformers(bert_dir, tmp_path):
    directory, hf_model, _ = bert_dir
    config, params, tokenizer = pretrained.load(directory)
    hf_config = pretrained.read_hf_config(directory)
    pretrained.save(tmp_path, config, params, hf_config=hf_config, tokenizer=tokenizer)
    reloaded = type(hf_model).from_pretrained(str(tmp_path)).eval()
    hf_checkpoints.assert_same_weights(reloaded, hf_model)
    assert tokenizer.encode("a dog runs", add_bos=True, add_eos=True) == (
        transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode("a dog runs")
    )  # [CLS] ... [SEP]


def test_bert_without_its_embedding_norm_breaks_parity(bert_dir, monkeypatch):
    """Negative control: the same weights without the embedding LayerNorm disagree."""
    directory, hf_model, _ = bert_dir
    config, params = pretrained.load_params(directory)
    config = models.ModelConfig(**{**config.__dict__, "embedding_norm": False})
    params = {**params, "encoder": {**params["encoder"]}}
    params["encoder"]["embedder"] = {
        k: v for k, v in params["encoder"]["embedder"].items() if k != "norm"
    }
    inputs, segment_ids = _padded_batch(config.vocab_size)
    ours = _encoder_logits(config, params, inputs, segment_ids)
    theirs = _hf_encoder_logits(hf_model, inputs, segment_ids)
    assert np.abs(_valid_rows(ours, segment_ids) - _valid_rows(theirs, segment_ids)).max() > 1e-3


@pytest.mark.parametrize("bert_dir", ["mlm"], indirect=True)
def test_bert_layer_norms_spelled_gamma_and_beta_load_as_scale_and_bias(bert_dir, tmp_path):
    """Older BERT files name a LayerNorm's weight "gamma" and its bias "beta": the same
    checkpoint in that spelling converts to the same parameters, each norm's scale its
    "gamma" and its bias its "beta"."""
    directory, hf_model, _ = bert_dir

    def old_spelling(tensors):
        renamed = {}
        for name, value in tensors.items():
            if ".LayerNorm." in name:
                name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
            renamed[name] = value
        return renamed

    old = _copy(directory, tmp_path, tensors=old_spelling)
    assert "bert.embeddings.LayerNorm.gamma" in safetensors_numpy.load_file(
        str(old / "model.safetensors")
    )
    _, params = pretrained.load_params(directory)
    _, old_params = pretrained.load_params(old)
    jax.tree.map(np.testing.assert_array_equal, old_params, params)
    state = hf_model.state_dict()
    norm = old_params["encoder"]["embedder"]["norm"]
    np.testing.assert_array_equal(norm["scale"], state["bert.embeddings.LayerNorm.weight"].numpy())
    np.testing.assert_array_equal(norm["bias"], state["bert.embeddings.LayerNorm.bias"].numpy())


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            dict(architectures=["BertForNextSentencePrediction"]),
            "names architectures ['BertForNextSentencePrediction']",
        ),
        (dict(hidden_act="gelu_new"), "hidden_act='gelu_new', an activation"),
        (dict(position_embedding_type="relative_key"), "position_embedding_type='relative_key'"),
    ],
)
def test_bert_unsupported_configs_are_named(bert_dir, tmp_path, edit, expected):
    directory, _, _ = bert_dir
    assert expected in _load_error(_copy(directory, tmp_path, config=lambda c: {**c, **edit}))


# ---------------------------------------------------------------------------------------------
# BertForPreTraining (what bert-base-uncased is): loaded as the masked-LM model.


@pytest.fixture(scope="module")
def pretraining_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert_pretraining")
    return directory, hf_checkpoints.bert(directory, "pretraining")


def test_bert_for_pretraining_loads_as_mlm_and_matches_its_prediction_logits(
    pretraining_dir, caplog
):
    directory, hf_model = pretraining_dir
    with caplog.at_level("WARNING", logger="tfjax.pretrained.checkpoint"):
        config, params = pretrained.load_params(directory)
    assert config.encoder_head == "mlm"
    (warning,) = [r.getMessage() for r in caplog.records if r.name.startswith("tfjax")]
    assert "cls.seq_relationship.weight, cls.seq_relationship.bias: the next-sentence" in warning
    assert "pooler.dense.weight" in warning and "\n" not in warning
    inputs, segment_ids = _padded_batch(config.vocab_size)
    ours = _encoder_logits(config, params, inputs, segment_ids)
    with torch.no_grad():
        theirs = hf_model(
            torch.tensor(inputs).long(), attention_mask=torch.tensor(segment_ids).long()
        ).prediction_logits.numpy()
    np.testing.assert_allclose(ours[segment_ids > 0], theirs[segment_ids > 0], **TOL)


def test_bert_for_pretraining_still_refuses_unknown_tensors(pretraining_dir, tmp_path):
    directory, _ = pretraining_dir
    extra = lambda w: {**w, "cls.seq_relationship.extra": np.ones(2, np.float32)}  # noqa: E731
    message = _load_error(_copy(directory, tmp_path, tensors=extra))
    assert "tensor cls.seq_relationship.extra (of 1 unused) has no place" in message


def test_bert_for_pretraining_exports_as_bert_for_masked_lm(pretraining_dir, tmp_path, caplog):
    directory, hf_model = pretraining_dir
    config, params = pretrained.load_params(directory)
    with caplog.at_level("WARNING", logger="tfjax.pretrained.bert"):
        pretrained.save(tmp_path, config, params, hf_config=pretrained.read_hf_config(directory))
    assert "exporting as BertForMaskedLM" in caplog.text
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"
    ]
    reloaded = transformers.BertForMaskedLM.from_pretrained(str(tmp_path)).eval()
    inputs, segment_ids = _padded_batch(config.vocab_size)
    with torch.no_grad():
        theirs = hf_model(
            torch.tensor(inputs).long(), attention_mask=torch.tensor(segment_ids).long()
        ).prediction_logits.numpy()
    np.testing.assert_allclose(
        _hf_encoder_logits(reloaded, inputs, segment_ids)[segment_ids > 0],
        theirs[segment_ids > 0],
        **TOL,
    )


# ---------------------------------------------------------------------------------------------
# Fine-tuning an imported BERT: masked LM on a text file, classification on a TSV file.


def _convert_and_tune(hf_dir, tmp_path, head, preset, overrides):
    from experiments import config_utils
    from tfjax.runs import pretrained as runs_pretrained
    from tfjax.runs import trainer
    from tfjax.training import logger

    config = config_utils.load_config(f"configs/pretrained.py:{preset}", FINE_TUNE + overrides)
    runs_pretrained.convert(hf_dir, tmp_path / "converted", config, head=head)
    spec = str(tmp_path / "converted" / "config.json")
    tuned = config_utils.load_config(spec, [f"train.init_from={tmp_path / 'converted'}"])
    result = trainer.train_and_evaluate(tuned, tmp_path / "tuned")
    return result, [r["loss"] for r in logger.read_metrics(tmp_path / "tuned", "train")]


FINE_TUNE = [
    "train.num_train_steps=12",
    "train.log_every_steps=3",
    "train.eval_every_steps=0",
    "train.checkpoint_every_steps=12",
    "optim.warmup_steps=0",
    "optim.learning_rate=3e-3",
]


@pytest.mark.slow  # about 25-45 s on a busy 2-core CPU
@pytest.mark.parametrize("bert_dir", ["mlm"], indirect=True)
def test_an_imported_bert_mlm_fine_tunes_on_a_text_file(bert_dir, tmp_path):
    directory, _, _ = bert_dir
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(t.lower() for t in hf_checkpoints.TEXTS[:4] * 16) + "\n")
    overrides = ["data.name=files", f"data.train_path={corpus}", "data.max_source_len=16"]
    result, losses = _convert_and_tune(directory, tmp_path, "mlm", "encoder_only_mlm", overrides)
    assert np.isfinite(result["loss"]) and 0 <= result["accuracy"] <= 1
    assert len(losses) == 4 and losses[-1] < losses[0], losses


@pytest.mark.slow  # about 25-45 s on a busy 2-core CPU
@pytest.mark.parametrize("bert_dir", ["classify"], indirect=True)
def test_an_imported_bert_classifier_fine_tunes_on_a_tsv_file(bert_dir, tmp_path):
    directory, _, _ = bert_dir
    rows = [(t.lower(), i % 3) for i, t in enumerate(hf_checkpoints.TEXTS[:4])] * 8
    for split in ("train", "test"):
        (tmp_path / f"{split}.tsv").write_text("".join(f"{t}\t{y}\n" for t, y in rows))
    overrides = [
        "data.name=files",
        f"data.train_path={tmp_path / 'train.tsv'}",
        f"data.eval_path={tmp_path / 'test.tsv'}",
        "data.max_source_len=16",
    ]
    result, losses = _convert_and_tune(directory, tmp_path, None, "encoder_only", overrides)
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    assert 0 <= result["accuracy"] <= 1
