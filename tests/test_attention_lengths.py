"""attention.Lengths: padding and causality as lengths, which cuDNN's fused attention applies in
its kernel (no [B, 1, L, S] bias, no bias gradient), and the models' use of it.

On a CPU the cuDNN call itself cannot run: the lengths path is checked through
`jax.nn.dot_product_attention`'s XLA implementation with the same arguments, and the models'
cuDNN configuration with cuDNN swapped for XLA (`_cudnn_as_xla`). The GPU tests at the end run
cuDNN itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.nn import attention, masking
from tfjax.nn.attention import core

ON_GPU = jax.default_backend() == "gpu"


def test_dense_mask_of_lengths_literal():
    lengths = attention.Lengths(jnp.array([3, 1]), jnp.array([2, 4]))
    want = np.zeros((2, 1, 4, 5), bool)
    want[0, 0, :3, :2] = True  # 3 query rows, 2 keys
    want[1, 0, :1, :4] = True  # 1 query row, 4 keys
    np.testing.assert_array_equal(lengths.dense(4, 5), want)
    causal = attention.Lengths(jnp.array([3]), jnp.array([3]), causal=True)
    want = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(causal.dense(4, 4)[0, 0], want)
    np.testing.assert_array_equal(
        attention.Lengths(causal=True).dense(3, 3)[0, 0], np.tril(np.ones((3, 3), bool))
    )
    assert attention.Lengths().dense(3, 4) is None
    np.testing.assert_array_equal(
        attention.Lengths(None, jnp.array([2, 0])).row_valid(3), [[True], [False]]
    )


def test_dense_mask_equals_the_segment_masks_of_unpacked_rows():
    segments = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    lengths = segments.sum(axis=1)
    got = attention.Lengths(lengths, lengths, causal=True).dense(5, 5)
    want = masking.segment_mask(segments) & masking.causal_mask(5)
    np.testing.assert_array_equal(got, want)
    sources = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    got = attention.Lengths(lengths, sources.sum(axis=1)).dense(5, 4)
    np.testing.assert_array_equal(got, masking.cross_attention_mask(segments, sources))


def _qkv(seed, b=3, length=6, kv_length=7, n=4, num_kv=2, h=8, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (b, length, n, h), dtype)
    k = jax.random.normal(keys[1], (b, kv_length, num_kv, h), dtype)
    v = jax.random.normal(keys[2], (b, kv_length, num_kv, h), dtype)
    return q, k, v


CASES = {
    # padded queries and keys, a row without keys (all its outputs zero), grouped-query heads
    "padding": (jnp.array([6, 2, 4]), jnp.array([7, 0, 3]), False, 7),
    "keys only": (None, jnp.array([1, 7, 5]), False, 7),
    "a row without queries": (jnp.array([0, 6, 3]), jnp.array([7, 2, 5]), False, 7),
    "causal": (jnp.array([6, 3, 1]), jnp.array([6, 3, 1]), True, 6),
    "causal, no padding": (None, None, True, 6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lengths_path_matches_the_reference_with_gradients(case):
    q_lengths, kv_lengths, causal, kv_length = CASES[case]
    q, k, v = _qkv(0, kv_length=kv_length)
    lengths = attention.Lengths(q_lengths, kv_lengths, causal=causal)
    weights = jnp.cos(jnp.arange(q.size, dtype=jnp.float32)).reshape(q.shape)

    def loss(q, k, v, fn):
        return jnp.sum(fn(q, k, v) * weights)

    def fast(q, k, v):  # what the cuDNN call computes, through XLA
        return core._jax_attention(q, k, v, lengths, None, "scaled_dot", "xla")

    def reference(q, k, v):
        mask = lengths.dense(q.shape[1], k.shape[1])
        return attention.dot_product_attention(q, k, v, mask=mask, implementation="reference")

    got = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, fast)
    want = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, reference)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    out = fast(q, k, v)
    for row in range(q.shape[0]) if q_lengths is not None else ():  # padded queries: zeros
        assert not np.any(out[row, int(q_lengths[row]) :])
    if kv_lengths is not None and int(kv_lengths.min()) == 0:
        assert not np.any(out[int(jnp.argmin(kv_lengths))])


@pytest.mark.parametrize("implementation", ["auto", "reference", "chunked"])
def test_other_paths_take_lengths_as_their_dense_mask(implementation):
    q, k, v = _qkv(1)
    lengths = attention.Lengths(jnp.array([6, 2, 4]), jnp.array([7, 0, 3]))
    got = attention.dot_product_attention(q, k, v, mask=lengths, implementation=implementation)
    want = attention.dot_product_attention(
        q, k, v, mask=lengths.dense(6, 7), implementation="reference"
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_causal_lengths_mask_needs_as_many_queries_as_keys():
    q, k, v = _qkv(2)  # 6 queries, 7 keys
    with pytest.raises(ValueError, match="causal Lengths mask is for self-attention"):
        attention.dot_product_attention(q, k, v, mask=attention.Lengths(causal=True))


def test_decoding_refuses_lengths():
    module = attention.MultiHeadAttention(num_heads=2)
    x = jnp.ones((1, 1, 8))
    with pytest.raises(ValueError, match=r"not core\.Lengths"):
        module.init(jax.random.key(0), x, mask=attention.Lengths(), decode=True)


@pytest.fixture
def _cudnn_as_xla(monkeypatch):
    """The cuDNN configuration runs on a CPU: cuDNN's call becomes XLA's with the same
    arguments. Returns the list of the masking arguments of every lengths-path call."""
    calls = []
    real = jax.nn.dot_product_attention

    def as_xla(*args, implementation=None, **kwargs):
        if kwargs.get("mask") is None and kwargs.get("bias") is None:
            seq = kwargs.get("query_seq_lengths"), kwargs.get("key_value_seq_lengths")
            calls.append((kwargs.get("is_causal", False), *(s is not None for s in seq)))
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "_check_cudnn", lambda q: None)
    monkeypatch.setattr(jax.nn, "dot_product_attention", as_xla)
    return calls


def _model_and_batch(kind: str, **overrides):
    fields = dict(
        kind=kind,
        vocab_size=32,
        embed_dim=16,
        num_heads=2,
        mlp_dim=32,
        num_layers=2,
        num_decoder_layers=2,
        max_len=16,
        dropout_rate=0.0,
        dtype="bfloat16",
        attention_impl="cudnn",
    )
    config = models.ModelConfig(**{**fields, **overrides})
    rng = np.random.default_rng(0)
    src_len, tgt_len = np.array([8, 5, 1]), np.array([6, 8, 3])
    batch = {}
    for field, lengths in (("inputs", src_len), ("targets", tgt_len)):
        segments = (np.arange(8)[None, :] < lengths[:, None]).astype(np.int32)
        batch[field] = rng.integers(3, 32, (3, 8), dtype=np.int32) * segments
        batch[f"{field}_segment_ids"] = segments
    if kind == "decoder_only":
        batch = {k: v for k, v in batch.items() if k.startswith("targets")}
    return models.create_model(config), batch


def _loss_and_grads(model, batch, positions: bool):
    if positions:  # explicit positions: the models keep their dense masks
        for field in ("inputs", "targets"):
            if field in batch:
                length = batch[field].shape[1]
                batch = {**batch, f"{field}_positions": np.tile(np.arange(length), (3, 1))}
    inputs = {k: jnp.asarray(v) for k, v in batch.items() if k != "targets"}
    targets = jnp.asarray(batch["targets"])
    params = model.init(jax.random.key(0), targets=targets, **inputs)["params"]

    def loss(params):
        logits = model.apply({"params": params}, targets=targets, **inputs)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * batch["targets_segment_ids"])

    return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize(
    "kind, overrides, want_calls",
    [
        # (is_causal, query lengths given, key lengths given) per lengths-path call
        pytest.param(
            "encoder_decoder",
            {},
            [(False, True, True)] * 2 + [(True, True, True)] * 2 + [(False, True, True)] * 2,
            marks=pytest.mark.slow,  # the two below run both kinds of call in the default tier
        ),
        ("decoder_only", {}, [(True, True, True)] * 2),
        # a position bias keeps the self-attention masks dense; cross-attention still uses lengths
        ("encoder_decoder", {"positional": "relative"}, [(False, True, True)] * 2),
    ],
)
def test_models_with_cudnn_mask_by_lengths_and_match_the_dense_masks(
    _cudnn_as_xla, kind, overrides, want_calls
):
    model, batch = _model_and_batch(kind, **overrides)
    got = _loss_and_grads(model, batch, positions=False)
    assert sorted(_cudnn_as_xla) == sorted(want_calls * 2)  # traced by init, then by apply
    _cudnn_as_xla.clear()
    want = _loss_and_grads(model, batch, positions=True)
    assert not _cudnn_as_xla  # explicit positions: the dense path, no lengths calls
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-3)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_lengths_match_the_reference_with_gradients(causal):
    b, length, n, h = 3, 128, 4, 64
    q, k, v = _qkv(5, b=b, length=length, kv_length=length, n=n, num_kv=n, h=h, dtype=jnp.bfloat16)
    lengths = attention.Lengths(jnp.array([128, 90, 1]), jnp.array([128, 77, 0]), causal=causal)
    if causal:
        lengths = attention.Lengths(jnp.array([128, 90, 1]), jnp.array([128, 90, 1]), causal=True)
    weights = jnp.cos(jnp.arange(h, dtype=jnp.float32))

    def loss(q, k, v, mask, implementation):
        out = attention.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * weights)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=4)
    got = grad(q, k, v, lengths, "cudnn")
    want = grad(q, k, v, lengths.dense(length, length), "reference")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.float32(a), np.float32(b)
        assert np.all(np.isfinite(a))
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b) + 1e-3


@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_cudnn_models_mask_by_lengths_as_with_dense_masks(kind):
    model, batch = _model_and_batch(kind, embed_dim=128, mlp_dim=256)  # heads of 64 on cuDNN
    got = _loss_and_grads(model, batch, positions=False)
    want = _loss_and_grads(model, batch, positions=True)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.float32(a), np.float32(b)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b) + 2e-3


@pytest.mark.slow  # 37 s on the 2-core CPU; the unscanned models are checked above
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_scanned_stacks_take_lengths_too(_cudnn_as_xla, kind):
    # nn.scan broadcasts the Lengths (a pytree) to every layer like a dense mask.
    model, batch = _model_and_batch(kind, scan_layers=True)
    got = _loss_and_grads(model, batch, positions=False)
    assert _cudnn_as_xla and (True, True, True) in _cudnn_as_xla
    want = _loss_and_grads(model, batch, positions=True)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-3)


def test_cudnn_with_a_bias_takes_the_dense_mask(_cudnn_as_xla):
    # cuDNN would need the bias's gradient anyway: the lengths become the dense mask.
    q, k, v = _qkv(3)
    lengths = attention.Lengths(jnp.array([6, 2, 4]), jnp.array([7, 1, 3]))
    bias = jax.random.normal(jax.random.key(4), (1, 4, 6, 7))
    got = attention.dot_product_attention(q, k, v, mask=lengths, bias=bias, implementation="cudnn")
    want = attention.dot_product_attention(
        q, k, v, mask=lengths.dense(6, 7), bias=bias, implementation="reference"
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not _cudnn_as_xla  # no lengths-path call
