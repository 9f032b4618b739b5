"""Parity of tfjax's post-LN encoder-decoder with PyTorch's `torch.nn.Transformer`.

The tfjax model is initialised at random (with random LayerNorm scales and random biases, so a
wrong norm or bias mapping fails), its weights are copied into `torch.nn.Transformer`, and the
encoder output, the decoder output and the tied logits are compared at 1e-5 in float32 on a
padded batch. `nn.Transformer` has no embeddings: its inputs are built here as
E[tokens] * sqrt(D) + PE[positions], with the sinusoidal table written out independently.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.models import transformer

torch = pytest.importorskip(
    "torch", reason="parity tests need the 'parity' extra: pip install torch"
)

# torch's encoder fast path packs padded rows into (prototype) nested tensors and says so.
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")

V, D, N, H, F = 23, 16, 4, 4, 32  # vocab, model width, heads, head width, feed-forward width
NUM_LAYERS = 2
BOS = 1
TOL = {"atol": 1e-5, "rtol": 1e-5}

# Source [B=2, S=7]: row 1 has 4 tokens then padding. Target [B=2, L=5]: row 0 has 3 tokens.
SOURCE_LENGTHS = (7, 4)
TARGET_LENGTHS = (3, 5)
S, L = max(SOURCE_LENGTHS), max(TARGET_LENGTHS)


def _config(attention_impl: str) -> models.ModelConfig:
    return models.ModelConfig(
        kind="encoder_decoder",
        vocab_size=V,
        embed_dim=D,
        num_layers=NUM_LAYERS,
        num_decoder_layers=NUM_LAYERS,
        num_heads=N,
        mlp_dim=F,
        dropout_rate=0.0,
        norm_position="post",
        activation="relu",
        layer_norm_epsilon=1e-5,
        final_norm=True,  # torch.nn.Transformer ends both stacks with a LayerNorm
        attention_impl=attention_impl,
        positional="sinusoidal",
        bos_id=BOS,
    )


def _torch_transformer():
    return torch.nn.Transformer(
        d_model=D,
        nhead=N,
        num_encoder_layers=NUM_LAYERS,
        num_decoder_layers=NUM_LAYERS,
        dim_feedforward=F,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
    ).eval()


def _batch():
    """Token ids (0 on padding) and segment ids (1 = token, 0 = padding), as numpy int32."""
    rng = np.random.default_rng(0)

    def padded(lengths, width):
        segment_ids = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
        tokens = rng.integers(2, V, size=(len(lengths), width)).astype(np.int32)
        return tokens * segment_ids, segment_ids

    inputs, inputs_segment_ids = padded(SOURCE_LENGTHS, S)
    targets, targets_segment_ids = padded(TARGET_LENGTHS, L)
    return inputs, inputs_segment_ids, targets, targets_segment_ids


def _sinusoid_table(length: int, dim: int) -> np.ndarray:
    """Vaswani et al. 2017, §3.5: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    table = np.zeros((length, dim), np.float64)
    for pos in range(length):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table.astype(np.float32)


def _random_params(seed: int = 0):
    """tfjax init params with every bias and norm scale replaced by random values."""
    inputs, inputs_segment_ids, targets, targets_segment_ids = _batch()
    model = models.EncoderDecoder(_config("reference"))
    params = jax.jit(model.init)(
        jax.random.key(seed),
        jnp.asarray(inputs),
        jnp.asarray(targets),
        inputs_segment_ids=jnp.asarray(inputs_segment_ids),
        targets_segment_ids=jnp.asarray(targets_segment_ids),
    )
    rng = np.random.default_rng(seed)

    def perturb(path, leaf):
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        if path[-1].key == "scale":
            return leaf + 0.3 * noise  # ones -> around 1
        if path[-1].key == "bias":
            return leaf + 0.1 * noise  # zeros -> small random
        return leaf

    return jax.tree_util.tree_map_with_path(perturb, params)


# ---------------------------------------------------------------------------------------------
# tfjax params -> torch.nn.Transformer.


def _set(tensor, value) -> None:
    value = np.array(value, np.float32)  # a writable copy
    assert tuple(tensor.shape) == value.shape, (tuple(tensor.shape), value.shape)
    tensor.copy_(torch.from_numpy(value))


def _copy_linear(linear, dense) -> None:
    """nn.Dense kernel [in, out] -> torch Linear weight [out, in] (y = x W^T + b)."""
    _set(linear.weight, np.asarray(dense["kernel"]).T)
    _set(linear.bias, dense["bias"])


def _copy_norm(norm, p) -> None:
    _set(norm.weight, p["scale"])
    _set(norm.bias, p["bias"])


def _copy_self_attention(mha, p) -> None:
    """Fused "qkv" [D, N+2K, H] (q heads, then k heads, then v heads) -> in_proj [3D, D]."""
    _set(mha.in_proj_weight, np.asarray(p["qkv"]["kernel"]).reshape(D, 3 * D).T)
    _set(mha.in_proj_bias, np.asarray(p["qkv"]["bias"]).reshape(3 * D))
    _copy_attention_out(mha, p)


def _copy_cross_attention(mha, p) -> None:
    """ "query" [D, N, H] and fused "kv" [D, 2K, H] -> the q rows and the k, v rows of in_proj."""
    q_kernel = np.asarray(p["query"]["kernel"]).reshape(D, D)
    kv_kernel = np.asarray(p["kv"]["kernel"]).reshape(D, 2 * D)
    _set(mha.in_proj_weight, np.concatenate([q_kernel, kv_kernel], axis=1).T)
    q_bias = np.asarray(p["query"]["bias"]).reshape(D)
    kv_bias = np.asarray(p["kv"]["bias"]).reshape(2 * D)
    _set(mha.in_proj_bias, np.concatenate([q_bias, kv_bias]))
    _copy_attention_out(mha, p)


def _copy_attention_out(mha, p) -> None:
    """ "out" [N, H, D] (heads concatenated head-major, as torch does) -> out_proj [D, N*H]."""
    _set(mha.out_proj.weight, np.asarray(p["out"]["kernel"]).reshape(N * H, D).T)
    _set(mha.out_proj.bias, p["out"]["bias"])


def _copy_feed_forward(layer, p) -> None:
    _copy_linear(layer.linear1, p["wi"])
    _copy_linear(layer.linear2, p["wo"])


def copy_tfjax_params_to_torch(params, model) -> None:
    """Writes tfjax EncoderDecoder params into a torch.nn.Transformer (embeddings stay apart)."""
    p = params["params"]
    with torch.no_grad():
        for i, layer in enumerate(model.encoder.layers):
            lp = p["encoder"][f"layer_{i}"]
            _copy_self_attention(layer.self_attn, lp["self_attention"])
            _copy_norm(layer.norm1, lp["self_attention_residual"]["norm"])
            _copy_feed_forward(layer, lp["mlp"])
            _copy_norm(layer.norm2, lp["mlp_residual"]["norm"])
        _copy_norm(model.encoder.norm, p["encoder"]["final_norm"])
        for i, layer in enumerate(model.decoder.layers):
            lp = p["decoder"][f"layer_{i}"]
            _copy_self_attention(layer.self_attn, lp["self_attention"])
            _copy_norm(layer.norm1, lp["self_attention_residual"]["norm"])
            _copy_cross_attention(layer.multihead_attn, lp["cross_attention"])
            _copy_norm(layer.norm2, lp["cross_attention_residual"]["norm"])
            _copy_feed_forward(layer, lp["mlp"])
            _copy_norm(layer.norm3, lp["mlp_residual"]["norm"])
        _copy_norm(model.decoder.norm, p["decoder"]["final_norm"])


# ---------------------------------------------------------------------------------------------
# The two forward passes.


@functools.cache
def _tfjax_forward_fn(attention_impl: str):
    """Jitted params -> (encoder output [B, S, D], decoder output [B, L, D], logits [B, L, V])."""
    inputs, inputs_segment_ids, targets, targets_segment_ids = _batch()
    model = models.EncoderDecoder(_config(attention_impl))

    def forward(params):
        logits, state = model.apply(
            params,
            jnp.asarray(inputs),
            jnp.asarray(targets),
            inputs_segment_ids=jnp.asarray(inputs_segment_ids),
            targets_segment_ids=jnp.asarray(targets_segment_ids),
            deterministic=True,
            capture_intermediates=lambda module, method: (
                method == "__call__"
                and isinstance(module, transformer.Encoder | transformer.Decoder)
            ),
            mutable=["intermediates"],
        )
        captured = state["intermediates"]
        (encoded,) = captured["encoder"]["__call__"]
        (decoded,) = captured["decoder"]["__call__"]
        return encoded, decoded, logits

    return jax.jit(forward)


def _tfjax_forward(params, attention_impl: str):
    """The encoder output, decoder output and logits of tfjax's EncoderDecoder, as numpy."""
    return tuple(np.asarray(x) for x in _tfjax_forward_fn(attention_impl)(params))


def _torch_forward(params, fastpath: bool):
    """The same three outputs from torch.nn.Transformer with the tfjax weights copied in."""
    inputs, inputs_segment_ids, targets, targets_segment_ids = _batch()
    torch.manual_seed(0)
    model = _torch_transformer()
    copy_tfjax_params_to_torch(params, model)
    embedding = torch.from_numpy(np.array(params["params"]["embed"]["embedding"], np.float32))

    # Decoder inputs: targets shifted right with BOS first; padding keeps id 0 (as tfjax does).
    decoder_inputs = np.concatenate([np.full((2, 1), BOS, np.int32), targets[:, :-1]], axis=1)
    decoder_inputs = decoder_inputs * targets_segment_ids

    def embed(tokens):
        positions = torch.from_numpy(_sinusoid_table(tokens.shape[1], D))
        return embedding[torch.from_numpy(tokens).long()] * math.sqrt(D) + positions

    src_padding = torch.from_numpy(inputs_segment_ids == 0)  # True = padding
    tgt_padding = torch.from_numpy(targets_segment_ids == 0)
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)  # True = masked
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(fastpath)
    try:
        with torch.no_grad():
            src, tgt = embed(inputs), embed(decoder_inputs)
            memory = model.encoder(src, src_key_padding_mask=src_padding)
            decoded = model.decoder(
                tgt,
                memory,
                tgt_mask=causal,
                tgt_key_padding_mask=tgt_padding,
                memory_key_padding_mask=src_padding,
            )
            full = model(
                src,
                tgt,
                tgt_mask=causal,
                src_key_padding_mask=src_padding,
                tgt_key_padding_mask=tgt_padding,
                memory_key_padding_mask=src_padding,
            )
            logits = full @ embedding.T  # tied output projection
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
    return memory.numpy(), decoded.numpy(), logits.numpy()


def _valid(x: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Rows at real (non-padding) positions, [#valid, ...]; padded rows are undefined in torch."""
    return x[segment_ids != 0]


@pytest.fixture(scope="module")
def params():
    return _random_params()


@pytest.fixture(scope="module")
def torch_outputs(params):
    return {fastpath: _torch_forward(params, fastpath) for fastpath in (True, False)}


# ---------------------------------------------------------------------------------------------
# Tests.


def test_batch_has_source_and_target_padding():
    _, inputs_segment_ids, _, targets_segment_ids = _batch()
    np.testing.assert_array_equal(
        inputs_segment_ids, [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]
    )
    np.testing.assert_array_equal(targets_segment_ids, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


def test_decoder_inputs_match_tfjax_shift_right():
    _, _, targets, targets_segment_ids = _batch()
    expected = np.concatenate([np.full((2, 1), BOS, np.int32), targets[:, :-1]], axis=1)
    expected = expected * targets_segment_ids
    shifted = models.shift_right(jnp.asarray(targets), BOS, jnp.asarray(targets_segment_ids))
    np.testing.assert_array_equal(shifted, expected)


@pytest.mark.parametrize("fastpath", [True, False], ids=["torch_fastpath", "torch_slowpath"])
@pytest.mark.parametrize("attention_impl", ["reference", "auto"])
def test_encoder_decoder_matches_torch_transformer(params, torch_outputs, attention_impl, fastpath):
    _, inputs_segment_ids, _, targets_segment_ids = _batch()
    jax_encoded, jax_decoded, jax_logits = _tfjax_forward(params, attention_impl)
    torch_encoded, torch_decoded, torch_logits = torch_outputs[fastpath]
    assert jax_encoded.shape == torch_encoded.shape == (2, S, D)
    assert jax_decoded.shape == torch_decoded.shape == (2, L, D)
    assert jax_logits.shape == torch_logits.shape == (2, L, V)
    np.testing.assert_allclose(
        _valid(jax_encoded, inputs_segment_ids),
        _valid(torch_encoded, inputs_segment_ids),
        err_msg="encoder output",
        **TOL,
    )
    np.testing.assert_allclose(
        _valid(jax_decoded, targets_segment_ids),
        _valid(torch_decoded, targets_segment_ids),
        err_msg="decoder output",
        **TOL,
    )
    np.testing.assert_allclose(
        _valid(jax_logits, targets_segment_ids),
        _valid(torch_logits, targets_segment_ids),
        err_msg="logits",
        **TOL,
    )


@pytest.mark.parametrize(
    "path",
    [
        ("encoder", "layer_0", "self_attention", "qkv", "kernel"),
        ("encoder", "final_norm", "scale"),
        ("decoder", "layer_1", "cross_attention", "kv", "kernel"),
        ("decoder", "layer_0", "mlp_residual", "norm", "bias"),
    ],
    ids=lambda path: "/".join(path),
)
def test_perturbed_weight_breaks_parity(params, torch_outputs, path):
    """Negative control: one changed tfjax weight makes the logits disagree with torch."""
    _, _, _, targets_segment_ids = _batch()

    def perturb(keys, leaf):
        names = tuple(k.key for k in keys)
        if names == ("params", *path):
            return leaf.at[(0,) * leaf.ndim].add(0.5)
        return leaf

    perturbed = jax.tree_util.tree_map_with_path(perturb, params)
    changed = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(perturbed), strict=True)
    ]
    assert sum(changed) == 1
    _, _, jax_logits = _tfjax_forward(perturbed, "reference")
    _, _, torch_logits = torch_outputs[False]
    difference = np.abs(
        _valid(jax_logits, targets_segment_ids) - _valid(torch_logits, targets_segment_ids)
    )
    assert difference.max() > 1e-3
