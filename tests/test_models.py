"""Tests for tfjax.models: config validation, parameter counts, properties of the three models."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from tfjax import models

TINY = dict(
    vocab_size=31,
    embed_dim=16,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    mlp_dim=32,
    max_len=32,
    dropout_rate=0.0,
)
SRC = jnp.array([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 0, 0]], jnp.int32)
SRC_SEG = (SRC > 0).astype(jnp.int32)
TGT = jnp.array([[13, 14, 15, 2, 0], [16, 17, 18, 19, 2]], jnp.int32)
TGT_SEG = (TGT > 0).astype(jnp.int32)


def _tiny(**overrides) -> models.ModelConfig:
    return models.ModelConfig(**{**TINY, **overrides})


def _init(cfg, *args, **kwargs):
    model = models.create_model(cfg)
    return model, model.init(jax.random.key(0), *args, **kwargs)


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("name, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_counts_match_the_paper(name, paper_millions):
    # Vaswani et al. 2017, Table 3, with a 37,000-token shared vocabulary (§5.1).
    cfg = models.preset(name, vocab_size=37000)
    model = models.create_model(cfg)
    tokens = jnp.ones((1, 8), jnp.int32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)
    count = _count(shapes) / 1e6
    assert abs(count - paper_millions) / paper_millions < 0.05, count


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(embed_dim=30, num_heads=4), "embed_dim"),
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
        (dict(positional="fourier"), "positional"),
        (dict(score="cosine"), "score"),
        (dict(norm="batchnorm"), "norm"),
        (dict(kind="seq2seq"), "kind"),
        (dict(dropout_rate=1.0), "dropout_rate"),
        (dict(kind="encoder_only", num_classes=1), "num_classes must be >= 2"),
        (dict(vocab_size=1), "vocab_size must be >= 2"),
        (dict(positional_combine="concat", positional_dim=0), "positional_dim"),
        (dict(positional_combine="concat", positional_dim=4, positional="rotary"), "concat"),
        (dict(attention_impl="cudnn"), "dtype='float32'"),
        (dict(attention_impl="cudnn", dtype="bfloat16", score="additive"), "score='additive'"),
        (
            dict(attention_impl="cudnn", dtype="bfloat16", attention_dropout_rate=0.1),
            "attention_dropout_rate",
        ),
    ],
)
def test_bad_config_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        _tiny(**overrides)


def test_cudnn_config_with_16_bit_compute_is_valid():
    assert _tiny(attention_impl="cudnn", dtype="bfloat16").attention_impl == "cudnn"


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _tiny().embed_dim = 8


def _slow(overrides: dict):
    """A variant run only in the slow tier (its feature has its own default-tier tests)."""
    return pytest.param(overrides, marks=pytest.mark.slow)


VARIANTS = [
    dict(),
    dict(positional="learned"),
    dict(positional="relative"),
    dict(positional="rotary"),
    dict(positional="alibi"),
    _slow(dict(positional="none")),
    dict(positional="sinusoidal", positional_combine="concat", positional_dim=4),
    _slow(dict(positional="learned", positional_combine="concat", positional_dim=6)),
    _slow(dict(sinusoidal_layout="halves", sinusoidal_base=500.0)),
    dict(norm="rmsnorm", norm_position="pre", activation="swiglu", use_bias=False),
    dict(activation="gelu", norm_position="pre"),
    dict(score="dot"),
    dict(score="general"),
    dict(score="additive"),
    dict(num_kv_heads=1),
    _slow(dict(num_kv_heads=2, fused_qkv=False)),
    _slow(dict(value_rank=3)),
    _slow(dict(window_radius=1)),
    _slow(dict(share_embeddings=False, tie_output=False)),
    _slow(dict(output_bias="on", embedding_norm=True, activation="gelu_tanh")),
    _slow(dict(tie_output=False, output_bias="off", activation="geglu_tanh")),
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(map(str, o.values())))
def test_encoder_decoder_variants_run_and_are_causal(overrides):
    cfg = _tiny(**overrides)
    model, variables = _init(cfg, SRC, TGT, inputs_segment_ids=SRC_SEG, targets_segment_ids=TGT_SEG)
    kwargs = dict(inputs_segment_ids=SRC_SEG, targets_segment_ids=TGT_SEG)
    logits = model.apply(variables, SRC, TGT, **kwargs)
    assert logits.shape == (2, 5, 31)
    assert np.isfinite(np.asarray(logits)).all()
    # Causality: changing targets at t >= 2 leaves the logits at t <= 2 unchanged (position t
    # sees targets[:t]).
    changed = TGT.at[:, 2:].set(jnp.array([20, 21, 22]))
    other = model.apply(variables, SRC, changed, **kwargs)
    np.testing.assert_allclose(other[:, :3], logits[:, :3], atol=1e-5)
    assert not np.allclose(other[:, 3:], logits[:, 3:])


def test_encoder_decoder_is_invariant_to_source_padding():
    cfg = _tiny()
    model, variables = _init(cfg, SRC, TGT)
    padded = jnp.pad(SRC, ((0, 0), (0, 3)))
    a = model.apply(variables, SRC, TGT, inputs_segment_ids=SRC_SEG)
    b = model.apply(variables, padded, TGT, inputs_segment_ids=(padded > 0).astype(jnp.int32))
    np.testing.assert_allclose(a, b, atol=1e-5)
    # Without segment ids the padding tokens are attended to and change the result.
    c = model.apply(variables, padded, TGT)
    assert not np.allclose(a, c, atol=1e-4)


def test_encode_decode_methods_compose_to_call():
    cfg = _tiny()
    model, variables = _init(cfg, SRC, TGT)
    encoded = model.apply(variables, SRC, inputs_segment_ids=SRC_SEG, method=model.encode)
    assert encoded.shape == (2, 6, 16)
    logits = model.apply(variables, encoded, TGT, inputs_segment_ids=SRC_SEG, method=model.decode)
    np.testing.assert_allclose(
        logits, model.apply(variables, SRC, TGT, inputs_segment_ids=SRC_SEG), atol=1e-6
    )


@pytest.mark.parametrize(
    "positional",
    [pytest.param("sinusoidal", marks=pytest.mark.slow), "rotary", "relative", "alibi"],
)
def test_decoder_only_packed_rows_equal_separate_rows(positional):
    cfg = _tiny(kind="decoder_only", positional=positional)
    a, b = jnp.array([[5, 6, 7]]), jnp.array([[8, 9, 10, 2]])
    packed = jnp.concatenate([a, b, jnp.zeros((1, 1), jnp.int32)], axis=1)  # [1, 8]
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
    positions = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
    model, variables = _init(cfg, packed)
    out = model.apply(variables, packed, targets_segment_ids=segments, targets_positions=positions)
    np.testing.assert_allclose(out[:, :3], model.apply(variables, a), atol=1e-5)
    np.testing.assert_allclose(out[:, 3:7], model.apply(variables, b), atol=1e-5)


def test_decoder_only_is_causal():
    cfg = _tiny(kind="decoder_only")
    model, variables = _init(cfg, TGT)
    logits = model.apply(variables, TGT)
    changed = model.apply(variables, TGT.at[:, 3].set(25))
    np.testing.assert_allclose(changed[:, :4], logits[:, :4], atol=1e-5)
    assert not np.allclose(changed[:, 4], logits[:, 4])


def test_shift_right_starts_every_segment_with_bos():
    targets = jnp.array([[5, 6, 7, 8, 9, 0]])
    segments = jnp.array([[1, 1, 2, 2, 2, 0]])
    np.testing.assert_array_equal(models.shift_right(targets, 1, segments), [[1, 5, 1, 7, 8, 0]])
    np.testing.assert_array_equal(models.shift_right(targets, 1), [[1, 5, 6, 7, 8, 9]])


@pytest.mark.parametrize("head, shape", [("classify", (2, 3)), ("mlm", (2, 6, 31))])
def test_encoder_only_heads_and_padding_invariance(head, shape):
    cfg = _tiny(kind="encoder_only", encoder_head=head, num_classes=3)
    model, variables = _init(cfg, SRC)
    out = model.apply(variables, SRC, inputs_segment_ids=SRC_SEG)
    assert out.shape == shape
    padded = jnp.pad(SRC, ((0, 0), (0, 2)))
    out_padded = model.apply(variables, padded, inputs_segment_ids=(padded > 0).astype(jnp.int32))
    np.testing.assert_allclose(out_padded[:, :6] if head == "mlm" else out_padded, out, atol=1e-5)


def test_tied_embeddings_share_one_table():
    tied = _init(_tiny(), SRC, TGT)[1]["params"]
    untied = _init(_tiny(share_embeddings=False, tie_output=False), SRC, TGT)[1]["params"]
    assert set(tied) == {"embed", "encoder", "decoder"}
    assert "logits_dense" in untied
    assert _count(untied) - _count(tied) == 31 * 16 + (16 * 31 + 31)


def test_jit_equals_eager_and_bf16_compute_keeps_float32_params():
    cfg = _tiny(dtype="bfloat16")
    model, variables = _init(cfg, SRC, TGT)
    assert {p.dtype for p in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
    eager = model.apply(variables, SRC, TGT)
    assert eager.dtype == jnp.bfloat16
    jitted = jax.jit(model.apply)(variables, SRC, TGT)
    np.testing.assert_allclose(
        np.asarray(eager, np.float32), np.asarray(jitted, np.float32), atol=5e-2
    )
    f32 = models.create_model(_tiny()).apply(variables, SRC, TGT)
    np.testing.assert_allclose(np.asarray(eager, np.float32), f32, atol=0.25)


def test_dropout_needs_an_rng_and_changes_outputs():
    cfg = _tiny(dropout_rate=0.3)
    model, variables = _init(cfg, SRC, TGT)
    det = model.apply(variables, SRC, TGT)
    noisy = model.apply(
        variables, SRC, TGT, deterministic=False, rngs={"dropout": jax.random.key(1)}
    )
    assert not np.allclose(det, noisy)


def test_tiny_model_overfits_one_batch():
    cfg = _tiny()
    model, variables = _init(cfg, SRC, TGT)
    params = variables["params"]
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    weights = TGT_SEG.astype(jnp.float32)

    def loss_fn(params):
        logits = model.apply(
            {"params": params}, SRC, TGT, inputs_segment_ids=SRC_SEG, targets_segment_ids=TGT_SEG
        )
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, TGT)
        return (nll * weights).sum() / weights.sum()

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    first = loss_fn(params)
    for _ in range(50):
        params, opt_state, loss = step(params, opt_state)
    assert loss < 0.05 * first, (first, loss)


def test_token_types_embedding_norm_and_logits_bias_of_an_encoder():
    cfg = models.ModelConfig(
        kind="encoder_only",
        encoder_head="mlm",
        vocab_size=31,
        embed_dim=8,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        num_token_types=2,
        embedding_norm=True,
        output_bias="on",
        dropout_rate=0.0,
    )
    model = models.create_model(cfg)
    variables = model.init(jax.random.key(0), SRC)
    params = variables["params"]
    assert params["logits_bias"].shape == (31,)
    assert params["encoder"]["embedder"]["token_type_embedding"].shape == (2, 8)
    assert set(params["encoder"]["embedder"]["norm"]) == {"scale", "bias"}
    zeros = model.apply(variables, SRC)
    np.testing.assert_allclose(model.apply(variables, SRC, inputs_token_types=0 * SRC), zeros)
    assert not np.allclose(model.apply(variables, SRC, inputs_token_types=0 * SRC + 1), zeros)
    shifted = {"params": {**params, "logits_bias": params["logits_bias"] + 1.5}}
    np.testing.assert_allclose(model.apply(shifted, SRC), zeros + 1.5, rtol=1e-5, atol=1e-5)


def test_output_bias_off_removes_the_untied_bias_and_auto_keeps_old_trees():
    def shapes(**overrides):
        cfg = _tiny(**overrides)
        return jax.tree.map(lambda x: x.shape, jax.eval_shape(lambda: _init_params(cfg)))

    assert "bias" in shapes(tie_output=False)["logits_dense"]
    assert "bias" not in shapes(tie_output=False, output_bias="off")["logits_dense"]
    assert "logits_bias" not in shapes()
    assert shapes(output_bias="on")["logits_bias"] == (31,)


def _init_params(cfg):
    return models.create_model(cfg).init(jax.random.key(0), SRC, TGT)["params"]


@pytest.mark.parametrize("tie_output", [True, False])
def test_rescale_output_multiplies_the_decoder_output_by_rsqrt_width(tie_output):
    """T5 v1.0's option: logits are linear in the decoder output, so they scale by 16**-0.5."""
    options = dict(tie_output=tie_output, output_bias="off")  # no bias: logits linear in x
    model, variables = _init(_tiny(**options), SRC, TGT)
    rescaled = models.create_model(_tiny(**options, rescale_output=True))
    logits = model.apply(variables, SRC, TGT)
    np.testing.assert_allclose(rescaled.apply(variables, SRC, TGT), logits * 0.25, atol=1e-6)


def test_t5_dropout_options_change_nothing_when_deterministic_and_add_no_parameters():
    cfg = _tiny(dropout_rate=0.3, final_dropout=True, mlp_dropout=True)
    model, variables = _init(cfg, SRC, TGT)
    plain, plain_variables = _init(_tiny(dropout_rate=0.3), SRC, TGT)
    assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, plain_variables)
    np.testing.assert_array_equal(
        model.apply(variables, SRC, TGT), plain.apply(variables, SRC, TGT)
    )
    rng = {"dropout": jax.random.key(1)}
    noisy = model.apply(variables, SRC, TGT, deterministic=False, rngs=rng)
    assert not np.allclose(noisy, plain.apply(variables, SRC, TGT, deterministic=False, rngs=rng))


def test_t5_mlp_dropout_drops_the_hidden_activations_of_every_feed_forward():
    """`mlp_dropout` (T5) gives every encoder and decoder MLP the model's `dropout_rate`; without
    it they drop nothing. With the same parameters and dropout key the two models differ in
    training mode only by those masks (each module folds its own name into the key, so the
    other dropouts draw the same masks)."""
    from tfjax.nn import layers

    rates = []

    def record(call, args, kwargs, context):
        if isinstance(context.module, layers.FeedForward) and context.method_name == "__call__":
            rates.append(context.module.dropout_rate)
        return call(*args, **kwargs)

    one_layer = {"num_layers": 1, "num_decoder_layers": 1, "dropout_rate": 0.3}
    variables = jax.jit(models.create_model(_tiny(**one_layer)).init)(jax.random.key(0), SRC, TGT)
    outputs = []
    for mlp_dropout in (True, False):
        model = models.create_model(_tiny(**one_layer, mlp_dropout=mlp_dropout))

        @jax.jit
        def train_mode(variables, model=model):
            with nn.intercept_methods(record):  # at trace time: once per MLP
                rngs = {"dropout": jax.random.key(1)}
                return model.apply(variables, SRC, TGT, deterministic=False, rngs=rngs)

        outputs.append(train_mode(variables))
    assert rates == [0.3, 0.3, 0.0, 0.0]  # the encoder's and the decoder's MLP, each model
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3
