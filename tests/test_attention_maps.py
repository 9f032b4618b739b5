"""Captured attention weights (`core.attention_weights`, the module's sow, `attention_maps`).

References: a per-head softmax written out in numpy, the module's own projections applied by
hand, weights @ values == the attention output of every path, and properties (causal rows,
padding columns, rows summing to 1, cached == uncached, scanned == unscanned). Without capture
nothing is computed: the weights function is never called and the train step is the same
program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfjax import models
from tfjax.data import tokenizers
from tfjax.inference import attention_maps
from tfjax.nn import attention, masking, stacking
from tfjax.nn.attention import local
from tfjax.nn.attention import module as attention_module
from tfjax.training import steps

B, L, S, N, H = 2, 5, 6, 4, 8
D = N * H


def _softmax_loop(q, k, mask, bias):
    """[B, N, L, S] probabilities, one head and one query at a time, in float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    b, length, n, h = q.shape
    group = n // k.shape[2]
    mask = np.broadcast_to(mask, (b, n, length, k.shape[1]))
    bias = np.broadcast_to(bias, (b, n, length, k.shape[1]))
    out = np.zeros((b, n, length, k.shape[1]))
    for bi in range(b):
        for ni in range(n):
            for li in range(length):
                allowed = mask[bi, ni, li]
                if not allowed.any():
                    continue
                logits = k[bi, :, ni // group] @ q[bi, li, ni] / np.sqrt(h) + bias[bi, ni, li]
                e = np.exp(logits[allowed] - logits[allowed].max())
                out[bi, ni, li, allowed] = e / e.sum()
    return out


def _qkv(num_kv=N, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (B, L, N, H))
    k = jax.random.normal(keys[1], (B, S, num_kv, H))
    v = jax.random.normal(keys[2], (B, S, num_kv, H))
    return q, k, v


def _mask():
    mask = np.array(jax.random.bernoulli(jax.random.key(3), 0.7, (B, 1, L, S)))
    mask[0, 0, 2] = False  # a row with no key at all
    return jnp.asarray(mask)


@pytest.mark.parametrize("num_kv", [N, 2, 1])
def test_attention_weights_match_a_softmax_written_out(num_kv):
    q, k, _ = _qkv(num_kv)
    mask, bias = _mask(), jax.random.normal(jax.random.key(4), (1, N, L, S))
    weights = attention.attention_weights(q, k, mask=mask, bias=bias)
    np.testing.assert_allclose(weights, _softmax_loop(q, k, mask, bias), atol=1e-6)
    sums = np.asarray(weights).sum(-1)  # [B, N, L]
    has_key = np.broadcast_to(np.asarray(mask).any(-1), sums.shape)
    np.testing.assert_allclose(sums[has_key], 1.0, rtol=1e-6)
    assert (sums[~has_key] == 0).all() and has_key.sum() < has_key.size


@pytest.mark.parametrize("implementation", ["auto", "reference"])
@pytest.mark.parametrize("score", ["scaled_dot", "dot"])
def test_weights_times_values_is_what_attention_returns(implementation, score):
    q, k, v = _qkv(num_kv=2)
    mask = _mask()
    out = attention.dot_product_attention(
        q, k, v, mask=mask, score=score, implementation=implementation
    )
    weights = attention.attention_weights(q, k, mask=mask, score=score)  # [B, N, L, S]
    v_full = jnp.repeat(v, 2, axis=2)  # [B, S, N, H]: head n reads kv head n // 2
    np.testing.assert_allclose(jnp.einsum("BNLS,BSNH->BLNH", weights, v_full), out, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# The module sows them.


def _module(**kwargs):
    return attention.MultiHeadAttention(num_heads=N, **kwargs)


def _x(length=L, seed=5):
    return jax.random.normal(jax.random.key(seed), (B, length, D))


def _sown(module, variables, *args, **kwargs):
    _, state = module.apply(variables, *args, mutable=["intermediates"], **kwargs)
    (weights,) = state["intermediates"][attention_module.ATTENTION_WEIGHTS]
    return weights


def test_the_module_sows_the_softmax_of_its_own_projections():
    module, x = _module(num_kv_heads=2), _x()
    variables = module.init(jax.random.key(0), x)
    mask = masking.causal_mask(L)
    weights = _sown(module, variables, x, mask=mask)
    qkv = variables["params"]["qkv"]  # fused: [D, N + 2K, H] and its bias
    projected = jnp.einsum("BLD,DMH->BLMH", x, qkv["kernel"]) + qkv["bias"]
    q, k = projected[:, :, :N], projected[:, :, N : N + 2]
    np.testing.assert_allclose(weights, _softmax_loop(q, k, mask, 0.0), atol=2e-5)


def test_sown_weights_are_the_same_on_every_attention_path():
    x = _x(length=8)
    window = local.Window(radius=2, causal=True)
    dense_mask, _ = local.dense_mask_and_bias(window, 8)
    outputs = {}
    for name, implementation, restrict in [
        ("reference, dense mask", "reference", dict(mask=dense_mask)),
        ("xla, dense mask", "auto", dict(mask=dense_mask)),
        ("blocked local window", "auto", dict(window=window)),
    ]:
        module = _module(implementation=implementation)
        variables = module.init(jax.random.key(0), x)
        outputs[name] = _sown(module, variables, x, **restrict)
    reference = outputs.pop("reference, dense mask")
    band = np.asarray(dense_mask[0, 0])
    assert (np.asarray(reference)[..., ~band] == 0).all()
    for name, weights in outputs.items():
        np.testing.assert_allclose(weights, reference, atol=1e-6, err_msg=name)


def test_decoding_sows_the_rows_of_uncached_causal_attention():
    module, x = _module(), _x()
    variables = module.init(jax.random.key(0), x)
    full = _sown(module, variables, x, mask=masking.causal_mask(L))  # [B, N, L, L]
    cache = module.init(jax.random.key(0), x, decode=True)["cache"]
    cache = jax.tree.map(jnp.zeros_like, cache)
    for t in range(L):
        _, state = module.apply(
            {**variables, "cache": cache},
            x[:, t : t + 1],
            mask=masking.cached_causal_mask(jnp.full((x.shape[0], 1), t), L),
            decode=True,
            mutable=["cache", "intermediates"],
        )
        cache = state["cache"]
        (row,) = state["intermediates"][attention_module.ATTENTION_WEIGHTS]  # [B, N, 1, L]
        np.testing.assert_allclose(row[:, :, 0], full[:, :, t], atol=1e-6, err_msg=f"step {t}")


# ---------------------------------------------------------------------------------------------
# Whole models.

TINY = dict(
    vocab_size=20, embed_dim=32, num_layers=2, num_decoder_layers=2, num_heads=4, mlp_dim=64
)
SRC = jnp.array([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]])
SRC_SEG = (jnp.arange(6) < jnp.array([[4], [6]])).astype(jnp.int32)
TGT = jnp.array([[13, 14, 2, 0], [15, 16, 17, 2]])
TGT_SEG = (jnp.arange(4) < jnp.array([[3], [4]])).astype(jnp.int32)


def _seq2seq(**overrides):
    model = models.EncoderDecoder(models.ModelConfig(**{**TINY, **overrides}))
    kwargs = dict(inputs_segment_ids=SRC_SEG, targets_segment_ids=TGT_SEG)
    return model, (SRC, TGT), kwargs


def test_capture_names_every_layer_and_respects_causality_and_padding():
    model, args, kwargs = _seq2seq()
    variables = model.init(jax.random.key(0), *args, **kwargs)
    logits, maps = attention_maps.capture(model, variables, *args, **kwargs)
    np.testing.assert_array_equal(logits, model.apply(variables, *args, **kwargs))
    assert list(maps) == [
        "decoder/layer_0/cross_attention",
        "decoder/layer_0/self_attention",
        "decoder/layer_1/cross_attention",
        "decoder/layer_1/self_attention",
        "encoder/layer_0/self_attention",
        "encoder/layer_1/self_attention",
    ]
    assert maps["encoder/layer_0/self_attention"].shape == (2, N, 6, 6)
    assert maps["decoder/layer_1/cross_attention"].shape == (2, N, 4, 6)
    self_attention = np.asarray(maps["decoder/layer_0/self_attention"])
    assert (self_attention[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0).all()
    cross = np.asarray(maps["decoder/layer_0/cross_attention"])
    assert (cross[0, :, :3, 4:] == 0).all()  # the first source has 4 tokens, then padding
    np.testing.assert_allclose(cross[0, :, :3].sum(-1), 1.0, rtol=1e-6)
    assert (cross[0, :, 3] == 0).all()  # a padded target row attends nowhere


def test_a_scanned_stack_gives_the_same_maps_under_the_same_names():
    model, args, kwargs = _seq2seq()
    scanned, _, _ = _seq2seq(scan_layers=True)
    params = model.init(jax.random.key(0), *args, **kwargs)["params"]
    _, maps = attention_maps.capture(model, {"params": params}, *args, **kwargs)
    stacked = {"params": stacking.stack_layers(params)}
    _, scanned_maps = attention_maps.capture(scanned, stacked, *args, **kwargs)
    assert list(scanned_maps) == list(maps)
    for name in maps:
        np.testing.assert_allclose(scanned_maps[name], maps[name], atol=1e-6, err_msg=name)


def test_collect_sorts_layers_naturally_and_numbers_repeated_calls():
    w = [jnp.full((1, 1, 1, 1), float(i)) for i in range(12)]
    sown = {f"layer_{i}": {"attn": {attention_maps.ATTENTION_WEIGHTS: (w[i],)}} for i in range(11)}
    sown["layer_3"]["attn"][attention_maps.ATTENTION_WEIGHTS] = (w[3], w[11])
    sown["layer_3"]["other"] = {"not_weights": (w[0],)}
    maps = attention_maps.collect({"decoder": sown})
    names = list(maps)
    assert names[:5] == [
        "decoder/layer_0/attn",
        "decoder/layer_1/attn",
        "decoder/layer_2/attn",
        "decoder/layer_3/attn#0",
        "decoder/layer_3/attn#1",
    ]
    assert names[-1] == "decoder/layer_10/attn" and len(names) == 12
    assert float(maps["decoder/layer_3/attn#1"][0, 0, 0, 0]) == 11.0


def test_without_capture_nothing_is_computed_and_the_train_step_is_the_same(monkeypatch):
    model, (src, tgt), kwargs = _seq2seq(num_layers=1, num_decoder_layers=1)
    batch = {
        "inputs": src,
        "targets": tgt,
        "inputs_segment_ids": kwargs["inputs_segment_ids"],
        "targets_segment_ids": kwargs["targets_segment_ids"],
    }
    optimizer = optax.adam(1e-3)
    state = steps.create_train_state(model, optimizer, jax.random.key(0), batch, "encoder_decoder")

    def lowered() -> str:  # a new step function each time: jit's trace cache would answer
        step = steps.make_train_step(
            model, optimizer, lambda count: 1e-3, kind="encoder_decoder", label_smoothing=0.1
        )
        return jax.jit(step).lower(state, batch, jax.random.key(1)).as_text(debug_info=False)

    before = lowered()

    def refuse(*args, **kwargs):
        raise AssertionError("attention weights computed without capture")

    monkeypatch.setattr(attention_module, "_weights", refuse)
    assert lowered() == before  # same program, and the weights function was never traced
    with pytest.raises(AssertionError, match="without capture"):
        attention_maps.capture(model, {"params": state.params}, src, tgt, **kwargs)


# ---------------------------------------------------------------------------------------------
# One example of each model kind, with token labels.


@pytest.fixture(scope="module")
def word_tokenizer():
    return tokenizers.WordTokenizer.build(["a b c d e f g h i j k l m n o p"])


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_example_maps_label_both_axes_for_each_model_kind(word_tokenizer, kind):
    config = models.ModelConfig(**TINY, kind=kind)
    model = models.create_model(config)
    source, target = [5, 6, 7, 2], [8, 9, 2]
    args = {"encoder_decoder": (SRC, TGT), "decoder_only": (TGT,), "encoder_only": (SRC,)}[kind]
    params = model.init(jax.random.key(0), *args)["params"]
    maps = attention_maps.example_maps(model, params, word_tokenizer, inputs=source, targets=target)
    src_pieces = word_tokenizer.pieces(source)
    read = word_tokenizer.pieces([config.bos_id, 8, 9])
    assert src_pieces[-1] == "<eos>" and read[0] == "<bos>"
    expected = {
        "encoder_decoder": ["self_attention"] * 4 + ["cross_attention"] * 2,
        "decoder_only": ["self_attention"] * 2,
        "encoder_only": ["self_attention"] * 2,
    }[kind]
    assert sorted(name.split("/")[-1] for name in maps.weights) == sorted(expected)
    for name, weights in maps.weights.items():
        assert weights.shape == (N, len(maps.queries[name]), len(maps.keys[name])), name
        if name.startswith("encoder/"):
            assert maps.queries[name] == maps.keys[name] == src_pieces
        else:
            assert maps.queries[name] == word_tokenizer.pieces(target)
            assert maps.keys[name] == (src_pieces if "cross" in name else read)
    if kind == "encoder_decoder":
        assert maps.layers("cross_attention") == [
            "decoder/layer_0/cross_attention",
            "decoder/layer_1/cross_attention",
        ]
    with pytest.raises(ValueError, match="non-empty"):
        attention_maps.example_maps(model, params, word_tokenizer, inputs=[], targets=[])


def test_until_eos_keeps_the_eos_and_drops_the_padding():
    assert attention_maps.until_eos(np.array([5, 6, 2, 0, 0])) == [5, 6, 2]
    assert attention_maps.until_eos([5, 6, 7]) == [5, 6, 7]


def test_pieces_of_each_tokenizer_kind():
    word = tokenizers.WordTokenizer.build(["the cat sat"])
    ids = word.encode("sat the dog", add_bos=True, add_eos=True)
    assert word.pieces(ids) == ["<bos>", "sat", "the", "<unk>", "<eos>"]
    char = tokenizers.CharTokenizer.build(["abc"])
    assert char.pieces(char.encode("cab")) == ["c", "a", "b"]
    texts = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog"] * 40)]
    sp = tokenizers.SentencePieceTokenizer.build(texts, vocab_size=60)
    ids = sp.encode("the cat sat", add_eos=True)
    pieces = sp.pieces(ids)
    assert pieces[-1] == "<eos>" and "".join(pieces[:-1]).replace("\u2581", " ").strip() == (
        "the cat sat"
    )
    for tokenizer in (word, char, sp):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tokenizer.pieces([tokenizer.vocab_size])


# ---------------------------------------------------------------------------------------------
# Statistics over many rows.


def test_row_statistics_of_literal_rows():
    logits = np.array([[0.0, 1.0, 3.0, -9.0], [2.0, 2.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    allowed = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], bool)  # row 3: one key
    weights = np.zeros((1, 1, 4, 4))
    for row in range(3):
        e = np.exp(logits[row][allowed[row]])
        weights[0, 0, row, allowed[row]] = e / e.sum()
    weights[0, 0, 3] = weights[0, 0, 0]  # a padded query row: not counted
    rows = jnp.asarray([[True, True, True, False]])
    out = jax.device_get(attention_maps.row_statistics(jnp.asarray(weights), rows))
    assert int(out["rows"]) == 2  # rows 0 and 1; row 2 has one key, row 3 is padding
    p0 = np.exp([0.0, 1.0, 3.0]) / np.exp([0.0, 1.0, 3.0]).sum()
    entropy = -(p0 * np.log(p0)).sum() + np.log(2.0)  # row 1: two equal weights
    np.testing.assert_allclose(out["entropy"], entropy, rtol=1e-5)
    np.testing.assert_allclose(out["max_weight"], p0.max() + 0.5, rtol=1e-6)
    np.testing.assert_allclose(out["logit_std"], np.std([0.0, 1.0, 3.0]) + 0.0, rtol=1e-5)


def _manual_statistics(model, params, batch, fields):
    """Means over the real rows with >= 2 keys, computed in numpy from `capture`'s weights."""
    args = [batch[f] for f in fields]
    segments = {f"{f}_segment_ids": batch[f"{f}_segment_ids"] for f in fields}
    _, maps = attention_maps.capture(model, {"params": params}, *args, **segments)
    out = {}
    for name, weights in maps.items():
        side = "inputs" if name.startswith("encoder/") or "targets" not in fields else "targets"
        real = np.asarray(batch[f"{side}_segment_ids"]) > 0
        values = {"entropy": [], "max_weight": [], "logit_std": []}
        for b, n, row in np.ndindex(*weights.shape[:3]):
            p = np.asarray(weights[b, n, row], np.float64)
            p = p[p > 0]
            if not real[b, row] or p.size < 2:
                continue
            values["entropy"].append(-(p * np.log(p)).sum())
            values["max_weight"].append(p.max())
            values["logit_std"].append(np.log(p).std())
        out[name] = {key: np.mean(v) for key, v in values.items()}
        out[name]["rows"] = len(values["entropy"])
    return out


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_statistics_average_the_real_rows_of_every_layer_in_any_batching(kind):
    model = models.create_model(models.ModelConfig(**TINY, kind=kind))
    fields = {"encoder_decoder": ["inputs", "targets"], "decoder_only": ["targets"]}
    fields = fields.get(kind, ["inputs"])
    data = {"inputs": SRC, "targets": TGT, "inputs_segment_ids": SRC_SEG}
    data["targets_segment_ids"] = TGT_SEG
    params = model.init(jax.random.key(0), *[data[f] for f in fields])["params"]
    examples = [{key: np.asarray(value[i]) for key, value in data.items()} for i in range(2)]
    examples.append({**examples[0], "labels": np.int32(1)})  # other fields are ignored
    batch = {key: jnp.asarray(np.stack([e[key] for e in examples])) for key in data}
    expected = _manual_statistics(model, params, batch, fields)
    for batch_size in (1, 2, 64):  # padded last batches must not count
        got = attention_maps.statistics(model, params, examples, batch_size=batch_size)
        assert list(got) == list(expected)
        for name in got:
            assert got[name]["rows"] == expected[name]["rows"] > 0, name
            for key in attention_maps.STATISTICS:
                np.testing.assert_allclose(got[name][key], expected[name][key], rtol=2e-5)
    with pytest.raises(ValueError, match="no examples"):
        attention_maps.statistics(model, params, [])


def test_unscaled_dot_scores_spread_the_first_layer_logits_by_sqrt_head_dim():
    scaled = models.create_model(models.ModelConfig(**TINY, kind="encoder_only"))
    dot = models.create_model(models.ModelConfig(**TINY, kind="encoder_only", score="dot"))
    params = scaled.init(jax.random.key(0), SRC)["params"]
    examples = [{"inputs": np.asarray(SRC[i]), "inputs_segment_ids": np.asarray(SRC_SEG[i])}
                for i in range(2)]  # fmt: skip
    a = attention_maps.statistics(scaled, params, examples)["encoder/layer_0/self_attention"]
    b = attention_maps.statistics(dot, params, examples)["encoder/layer_0/self_attention"]
    head_dim = TINY["embed_dim"] // TINY["num_heads"]
    np.testing.assert_allclose(b["logit_std"], np.sqrt(head_dim) * a["logit_std"], rtol=1e-4)
    assert b["entropy"] < a["entropy"] and b["max_weight"] > a["max_weight"]
