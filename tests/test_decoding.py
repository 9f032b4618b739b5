"""tfjax.inference.decoding: the KV cache against full recomputation, generation and sampling.

Tolerance: cached and uncached logits agree to 1e-5 (float32, tiny models with fixed params).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.inference import decoding
from tfjax.nn import masking
from tfjax.nn.attention import cache as kv_cache

TINY = dict(
    vocab_size=20,
    embed_dim=16,
    num_layers=1,
    num_decoder_layers=2,
    num_heads=4,
    mlp_dim=32,
    max_len=16,
    dropout_rate=0.0,
)
SRC = jnp.array([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 0, 0]], jnp.int32)
SRC_SEG = (SRC > 0).astype(jnp.int32)
TGT = jnp.array([[4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17]], jnp.int32)
ATOL = 1e-5
# Compiling dominates these tests on CPU; XLA's backend optimisation level 0 halves it.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
NO_EOS = -1  # an id that never occurs: rows run to max_length


@functools.cache
def _model(kind: str = "encoder_decoder", **overrides):
    cfg = models.ModelConfig(**{**TINY, "kind": kind, **overrides})
    model = models.create_model(cfg)
    args = (SRC, TGT) if kind == "encoder_decoder" else (TGT,)
    return model, _jit(model.init)(jax.random.key(0), *args)["params"]


def _without_cross_projection(params):
    """params with the cross-attention key/value projections zeroed."""
    projections = {"kv", "key", "value", "value_down", "value_up"}

    def zero(path, x):
        names = {getattr(k, "key", None) for k in path}
        return jnp.zeros_like(x) if "cross_attention" in names and names & projections else x

    return jax.tree_util.tree_map_with_path(zero, params)


def _cached_and_full_logits(model, params, inputs, targets, slots=()):
    """(cached, full) logits [B, L, V]: the decoder inputs fed one position at a time through
    the cache (`lax.scan`), and the uncached model over the whole targets.

    The steps get params without the cross-attention key/value projections, so they match
    only if the encoder keys/values come from the cache (projected once, by `prefill`). `slots`
    (increasing, each < L): the cache starts with slots[0] self-attention slots and grows
    (`kv_cache.grow`) to each next one, then to L, when it is full.
    """
    b, length = targets.shape
    seg = None if inputs is None else SRC_SEG
    sizes = (*slots, length)

    @_jit
    def run(params):
        decoder_inputs = models.shift_right(targets, 1)
        cache = decoding.prefill(
            model,
            params,
            batch_size=b,
            max_length=sizes[0],
            inputs=inputs,
            inputs_segment_ids=seg,
        )
        step_fn = decoding.make_step_fn(model, _without_cross_projection(params), seg)

        def step(cache, t):
            tokens = jax.lax.dynamic_slice_in_dim(decoder_inputs, t, 1, axis=1)  # [B, 1]
            logits, cache = step_fn(tokens, jnp.full((b, 1), t, jnp.int32), cache)
            return cache, logits

        rest = []
        for i, end in enumerate(sizes):
            assert kv_cache.slots(cache) == end
            start = sizes[i - 1] if i else 0
            cache, logits_part = jax.lax.scan(step, cache, jnp.arange(start, end))
            rest.append(logits_part)  # [end - start, B, V]
            if end < length:
                cache = kv_cache.grow(cache, sizes[i + 1])
        cached = jnp.swapaxes(jnp.concatenate(rest, axis=0), 0, 1)  # [B, L, V]
        args = (targets,) if inputs is None else (inputs, targets)
        kwargs = {} if inputs is None else {"inputs_segment_ids": seg}
        return cached, model.apply({"params": params}, *args, **kwargs)

    return run(params)


CACHE_VARIANTS = {
    "sinusoidal": dict(),
    "rotary": dict(positional="rotary"),
    "relative": dict(positional="relative"),
    "alibi": dict(positional="alibi"),
    "gqa": dict(num_kv_heads=1),
    "general_score": dict(score="general"),  # the cache transposed back for the einsum path
    "low_rank_values": dict(value_rank=3),  # the cache holds value_up's output
}


@pytest.mark.parametrize("variant", ["sinusoidal", "low_rank_values"])
def test_prefill_stores_the_encoder_keys_and_writes_no_self_attention_slot(variant):
    """`prefill` runs the decoder on zero new tokens: the cross-attention cache holds what a
    step that feeds BOS with the encoder output stores, and nothing else is written."""
    model, params = _model(**CACHE_VARIANTS[variant])
    common = dict(batch_size=2, max_length=5, inputs=SRC, inputs_segment_ids=SRC_SEG)
    cache = _jit(lambda p: decoding.prefill(model, p, **common))(params)

    @_jit
    def bos_step(params):  # one step with the encoder output: it fills the cross cache itself
        encoded = model.apply(
            {"params": params}, SRC, inputs_segment_ids=SRC_SEG, method=model.encode
        )
        zeros = decoding.init_cache(model, params, batch_size=2, max_length=5, source_length=6)
        bos = jnp.ones((2, 1), jnp.int32)
        _, state = model.apply(
            {"params": params, "cache": zeros},
            bos,
            positions=jnp.zeros_like(bos),
            method=model.decode_step,
            mutable=["cache"],
            encoded=encoded,
            inputs_segment_ids=SRC_SEG,
        )
        return state["cache"]

    want = bos_step(params)
    flat = dict(jax.tree_util.tree_leaves_with_path(cache))
    names = {path: kv_cache.variable_name(path) for path in flat}
    assert {"cached_cross_key", "cached_cross_value", "cache_index"} <= set(names.values())
    for path, x in flat.items():
        if names[path].startswith("cached_cross_"):
            np.testing.assert_allclose(x, dict(jax.tree_util.tree_leaves_with_path(want))[path])
            assert np.abs(np.asarray(x)).max() > 0
        else:  # the self-attention slots and write index: untouched
            np.testing.assert_array_equal(x, np.zeros_like(x))


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("variant", CACHE_VARIANTS)
def test_cached_logits_equal_full_recompute_at_every_step(kind, variant):
    model, params = _model(kind, **CACHE_VARIANTS[variant])
    inputs = SRC if kind == "encoder_decoder" else None
    cached, full = _cached_and_full_logits(model, params, inputs, TGT)
    np.testing.assert_allclose(cached, full, atol=ATOL)


@pytest.mark.parametrize(
    "kind, positional",
    [
        ("decoder_only", "learned"),
        ("decoder_only", "relative"),
        ("decoder_only", "alibi"),
        ("encoder_decoder", "rotary"),
    ],
)
def test_cached_logits_with_a_window_equal_full_recompute(kind, positional):
    # The full pass takes the blocked local path (radius 2 < 7 targets), the cache the dense
    # `cached_causal_mask` with the same radius.
    model, params = _model(kind, window_radius=2, positional=positional)
    inputs = SRC if kind == "encoder_decoder" else None
    cached, full = _cached_and_full_logits(model, params, inputs, TGT)
    np.testing.assert_allclose(cached, full, atol=ATOL)


# The variants whose masks or position terms depend on the cache's length.
GROWTH_VARIANTS = {
    **{
        name: ("encoder_decoder", CACHE_VARIANTS[name])
        for name in ("sinusoidal", "rotary", "relative", "alibi")
    },
    "decoder_only_rotary": ("decoder_only", dict(positional="rotary")),
    "window_relative": ("decoder_only", dict(window_radius=2, positional="relative")),
    "scanned_layers": ("encoder_decoder", dict(scan_layers=True, positional="alibi")),
}


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(v, marks=pytest.mark.slow) if v in ("rotary", "relative", "alibi") else v
        for v in GROWTH_VARIANTS
    ],  # those three grow as sinusoidal does; cached == uncached keeps them default
)
def test_a_cache_grown_while_decoding_gives_the_full_recompute_logits(variant):
    # Slots 2, then 3, then 7: the positions after each growth read the written slots where
    # they were, and the masks and position biases follow the cache's new length.
    kind, overrides = GROWTH_VARIANTS[variant]
    model, params = _model(kind, **overrides)
    inputs = SRC if kind == "encoder_decoder" else None
    cached, full = _cached_and_full_logits(model, params, inputs, TGT, slots=(2, 3))
    np.testing.assert_allclose(cached, full, atol=ATOL)


def test_grow_pads_self_attention_slots_and_leaves_the_rest():
    key = jnp.arange(12.0).reshape(1, 2, 3, 2)  # [B, K, T, H]
    cache = {
        "layer": {
            "self_attention": {"cached_key": key, "cached_value": -key, "cache_index": 3},
            "cross_attention": {"cached_cross_key": key, "cached_cross_value": key},
        }
    }
    assert kv_cache.slots(cache) == 3
    grown = kv_cache.grow(cache, 5)
    assert kv_cache.slots(grown) == 5
    self_attention = grown["layer"]["self_attention"]
    np.testing.assert_array_equal(self_attention["cached_key"][0, 1, :, 0], [6, 8, 10, 0, 0])
    np.testing.assert_array_equal(self_attention["cached_value"][..., :3, :], -key)
    assert self_attention["cache_index"] == 3
    assert grown["layer"]["cross_attention"]["cached_cross_key"] is key
    assert kv_cache.slots({"cache_index": 0}) is None
    with pytest.raises(ValueError, match="cannot grow a cache of 3 slots to 2"):
        kv_cache.grow(cache, 2)


@pytest.mark.parametrize(
    "max_length, start, want",
    [
        (64, 16, (16, 32, 64)),
        (65, 16, (16, 32, 65)),
        (48, 16, (16, 48)),  # 32 > 48 / 2: no phase of 32 slots
        (20, 16, (20,)),  # short decodes keep one loop
        (9, 2, (2, 4, 9)),
        (64, 0, (64,)),
    ],
)
def test_cache_phases_double_from_the_start_while_at_most_half_of_max_length(
    max_length, start, want
):
    assert decoding.cache_phases(max_length, start) == want


def test_cache_phases_and_while_growing_reject_bad_sizes():
    with pytest.raises(ValueError, match=">= 0"):
        decoding.cache_phases(8, -1)
    cache = {"cached_key": jnp.zeros((1, 1, 4, 2))}
    with pytest.raises(ValueError, match="cannot grow a cache of 4 slots to 4"):
        decoding.while_growing(
            lambda s: True,
            lambda s: s,
            cache,
            grow_to=(4, 8),
            t_of=lambda s: 0,
            cache_of=lambda s: s,
            with_cache=lambda s, c: c,
        )


def test_init_cache_shapes_and_zeros():
    model, params = _model(num_kv_heads=2)
    cache = decoding.init_cache(model, params, batch_size=3, max_length=9, source_length=5)
    layer = cache["decoder"]["layer_1"]
    assert layer["self_attention"]["cached_key"].shape == (3, 2, 9, 4)  # [B, K, max_len, H]
    assert layer["self_attention"]["cache_index"].shape == ()
    assert layer["cross_attention"]["cached_cross_value"].shape == (3, 2, 5, 4)  # [B, K, S, H]
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(cache))
    with pytest.raises(ValueError, match="source_length"):
        decoding.init_cache(model, params, batch_size=3, max_length=9)


def test_cached_causal_mask_is_literal():
    mask = masking.cached_causal_mask(jnp.array([[2], [0]]), 4, window_radius=1)
    np.testing.assert_array_equal(mask[:, 0, 0], [[0, 1, 1, 0], [1, 0, 0, 0]])


@functools.cache
def _jit_generate(model, **static):
    return _jit(functools.partial(decoding.generate, model, **static))


@functools.cache
def _greedy_reference():
    """Uncached greedy tokens [B, 8] without EOS, and an EOS id the model emits at t = 3."""
    model, params = _model()
    greedy = functools.partial(decoding.greedy_decode, model, max_length=8, eos_id=NO_EOS)
    raw = _jit(greedy)(params, SRC, inputs_segment_ids=SRC_SEG)
    return raw, int(raw[0, 3])


@pytest.mark.parametrize("cache_start", [0, 1, 3])
def test_cached_greedy_equals_uncached_greedy_with_padded_sources(cache_start):
    # 0: one loop over 8 slots; 1: slots 1, 2, 4, 8; 3: slots 3, 8.
    model, params = _model()
    raw, eos = _greedy_reference()
    # greedy_decode masks after EOS at the end, so masking `raw` equals calling it with `eos`.
    reference = jnp.where(decoding.after_eos(raw, eos), 0, raw)
    assert (reference == eos).any() and (reference == 0).any()
    out = _jit_generate(model, max_length=8, eos_id=eos, cache_start=cache_start)(
        params, inputs=SRC, inputs_segment_ids=SRC_SEG
    )
    np.testing.assert_array_equal(out, reference)


def _oracle_reference(model, params, eos, lengths, max_length=8):
    """Uncached greedy with EOS forbidden before lengths[b] and written at it, row by row."""
    variables = {"params": params}
    encoded = model.apply(variables, SRC, inputs_segment_ids=SRC_SEG, method=model.encode)
    buf = np.zeros((SRC.shape[0], max_length), np.int32)
    for t in range(max_length):
        logits = np.array(
            model.apply(
                variables,
                encoded,
                jnp.asarray(buf),
                inputs_segment_ids=SRC_SEG,
                method=model.decode,
            )[:, t]
        )  # [B, V]
        for b, length in enumerate(lengths):
            if t < length:
                logits[b, eos] = -np.inf
                buf[b, t] = int(np.argmax(logits[b]))
            elif t == length:
                buf[b, t] = eos
    return buf


@pytest.mark.parametrize("lengths", [pytest.param(("own", 6), marks=pytest.mark.slow), (5, 2)])
def test_oracle_lengths_put_eos_exactly_there_and_nowhere_before(lengths):
    model, params = _model()
    raw, eos = _greedy_reference()
    own = int(np.argmax(np.asarray(raw[0]) == eos))  # where the model itself ends row 0
    lengths = tuple(own if length == "own" else length for length in lengths)
    out = np.asarray(
        _jit_generate(model, max_length=8, eos_id=eos)(
            params, inputs=SRC, inputs_segment_ids=SRC_SEG, lengths=jnp.asarray(lengths)
        )
    )
    np.testing.assert_array_equal(out, _oracle_reference(model, params, eos, lengths))
    for b, length in enumerate(lengths):
        assert out[b, length] == eos and not (out[b, :length] == eos).any()
    if lengths[0] == own:  # the model's own length: the oracle changes nothing in that row
        np.testing.assert_array_equal(out[0, : own + 1], raw[0, : own + 1])
    else:  # made to go on past its own EOS
        assert lengths[0] > own
    with pytest.raises(ValueError, match="encoder-decoder"):
        lm, lm_params = _model("decoder_only")
        decoding.generate(
            lm,
            lm_params,
            max_length=8,
            eos_id=eos,
            prompts=TGT[:, :2],
            lengths=jnp.asarray(lengths),
        )


@functools.cache
def _jit_apply(model):
    return _jit(model.apply)


def _uncached_lm_greedy(model, params, prompt, max_length, eos):
    """Row by row: the full model over the buffer, argmax at the next position."""
    apply = _jit_apply(model)
    buf = np.zeros((1, max_length), np.int32)
    buf[0, : len(prompt)] = prompt
    for t in range(len(prompt), max_length):
        buf[0, t] = int(jnp.argmax(apply({"params": params}, jnp.asarray(buf))[0, t]))
        if buf[0, t] == eos:
            break
    return buf[0]


@pytest.mark.parametrize("cache_start", [0, 2])
def test_decoder_only_prompts_of_different_lengths_equal_uncached_rows(cache_start):
    # cache_start 2: slots 2, 4, 10, so the prompt of row 0 fills two caches.
    model, params = _model("decoder_only", positional="rotary")
    prompts = jnp.array([[4, 5, 6, 7], [8, 9, 0, 0]], jnp.int32)
    lengths = jnp.array([4, 2], jnp.int32)
    eos = int(_uncached_lm_greedy(model, params, np.asarray(prompts[0]), 10, NO_EOS)[6])
    out = _jit_generate(model, max_length=10, eos_id=eos, cache_start=cache_start)(
        params, prompts=prompts, prompt_lengths=lengths
    )
    for b, length in enumerate([4, 2]):
        expected = _uncached_lm_greedy(model, params, np.asarray(prompts[b, :length]), 10, eos)
        np.testing.assert_array_equal(out[b], expected)
    assert (out == eos).any() and (out[:, -1] == 0).any()


def test_sliding_window_continues_from_the_last_context_tokens():
    model, params = _model("decoder_only", positional="learned")
    context, prompts = 5, jnp.array([[4, 5], [8, 9]], jnp.int32)
    head = _jit_generate(model, max_length=context, eos_id=NO_EOS)(params, prompts=prompts)
    slide = jax.jit(
        functools.partial(
            decoding.generate_sliding, model, max_length=14, context=context, eos_id=NO_EOS
        )
    )
    out = np.asarray(slide(params, head))
    np.testing.assert_array_equal(out[:, :context], head)
    # Reference written out: BOS + the previous `context` tokens at positions 0..context.
    apply = _jit_apply(model)
    for b in range(2):
        for t in range(context, 14):
            window = np.append(out[b, t - context : t], 0)[None]
            logits = apply({"params": params}, jnp.asarray(window))[0, context]
            assert out[b, t] == int(jnp.argmax(logits)), (b, t)
    # At the boundary the window is the whole cached prefix: both ways give the same token.
    cached = _jit_generate(model, max_length=context + 1, eos_id=NO_EOS)(params, prompts=prompts)
    np.testing.assert_array_equal(out[:, : context + 1], cached)
    # From N = context + 1 on, token 0 is outside every window: changing it changes nothing.
    np.testing.assert_array_equal(slide(params, cached), out)
    np.testing.assert_array_equal(slide(params, cached.at[:, 0].set(17))[:, 1:], out[:, 1:])
    with pytest.raises(ValueError, match="context <= N < max_length"):
        decoding.generate_sliding(model, params, head, max_length=4, context=5, eos_id=NO_EOS)


def test_sampling_top_k_1_is_greedy():
    model, params = _model()
    _, eos = _greedy_reference()
    kwargs = dict(inputs=SRC, inputs_segment_ids=SRC_SEG)
    greedy = _jit_generate(model, max_length=8, eos_id=eos)(params, **kwargs)
    top1 = _jit_generate(model, max_length=8, eos_id=eos, temperature=1.0, top_k=1)
    np.testing.assert_array_equal(top1(params, rng=jax.random.key(3), **kwargs), greedy)
    logits = jax.random.normal(jax.random.key(0), (4, 20))
    np.testing.assert_array_equal(
        decoding.sample_logits(logits, jax.random.key(1), temperature=0.5, top_k=1),
        jnp.argmax(logits, axis=-1),
    )


def test_choose_fn_folds_the_step_into_the_key_and_passes_the_filters():
    logits = jax.random.normal(jax.random.key(0), (64, 20))
    rng = jax.random.key(5)
    # The second options make top-p bind (with top-k 3 it rarely removes anything).
    for temperature, top_k, top_p in ((0.7, 3, 0.9), (0.7, 0, 0.6)):
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        choose = decoding.make_choose_fn(rng=rng, **options)
        # [B, V]: the tokens the filters leave, written out in numpy
        rows = np.asarray(logits)
        kept = np.stack([_renormalised(z, temperature, top_k or 20, top_p) > 0 for z in rows])
        for t in (0, 3):
            want = decoding.sample_logits(logits, jax.random.fold_in(rng, t), **options)
            chosen = np.asarray(choose(logits, t))
            np.testing.assert_array_equal(chosen, want)
            assert kept[np.arange(64), chosen].all(), options
    greedy = decoding.make_choose_fn(temperature=0.0, top_k=0, top_p=1.0, rng=None)
    np.testing.assert_array_equal(greedy(logits, 2), jnp.argmax(logits, axis=-1))


def test_sampling_is_seeded():
    model, params = _model("decoder_only", positional="rotary")
    sample = _jit_generate(model, max_length=10, eos_id=NO_EOS, temperature=2.0, top_p=0.95)
    prompts = jnp.array([[4, 5], [8, 9]], jnp.int32)
    a = sample(params, prompts=prompts, rng=jax.random.key(1))
    np.testing.assert_array_equal(a, sample(params, prompts=prompts, rng=jax.random.key(1)))
    assert not np.array_equal(a, sample(params, prompts=prompts, rng=jax.random.key(2)))
    np.testing.assert_array_equal(a[:, :2], prompts)


def test_filter_top_k_keeps_the_k_largest():
    logits = jnp.array([[1.0, 4.0, 3.0, 2.0], [0.0, -1.0, 5.0, 5.0]])
    kept = decoding.filter_top_k(logits, 2) > decoding.FILTERED
    np.testing.assert_array_equal(kept, [[0, 1, 1, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(decoding.filter_top_k(logits, 0), logits)


def test_filter_top_p_keeps_the_smallest_set_reaching_p():
    probs = jnp.array([[0.5, 0.05, 0.3, 0.15], [0.9, 0.04, 0.03, 0.03]])
    logits = jnp.log(probs)
    kept = lambda p: np.asarray(decoding.filter_top_p(logits, p) > decoding.FILTERED)  # noqa: E731
    np.testing.assert_array_equal(kept(0.7), [[1, 0, 1, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(kept(0.85), [[1, 0, 1, 1], [1, 0, 0, 0]])
    np.testing.assert_array_equal(kept(0.01), [[1, 0, 0, 0], [1, 0, 0, 0]])  # at least one
    np.testing.assert_array_equal(kept(1.0), np.ones((2, 4)))
    with pytest.raises(ValueError, match="top_p"):
        decoding.filter_top_p(logits, 0.0)


@pytest.mark.parametrize("shape, k", [((3, 5000), 8), ((2, 2049), 3), ((4, 1000), 2)])
@pytest.mark.parametrize("values", ["normal", "few_levels", "with_minus_inf"])
def test_blocked_top_k_equals_lax_top_k_ties_included(shape, k, values):
    # Rows of at least 4 k blocks take the blocked path; 2,049 entries end in a partial block.
    assert shape[1] >= 4 * k * decoding.TOP_K_BLOCK
    x = jax.random.normal(jax.random.key(3), shape)
    if values == "few_levels":  # many equal entries across blocks: ties broken by index
        x = jnp.round(x)
    elif values == "with_minus_inf":
        x = jnp.where(x < 1.5, -jnp.inf, x)
    got, want = decoding.blocked_top_k(x, k), jax.lax.top_k(x, k)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    stock = jax.make_jaxpr(lambda x: decoding.blocked_top_k(x, k, block=0))(x)
    assert [e.primitive.name for e in stock.eqns] == ["top_k"]  # the switch: lax.top_k alone


def test_filter_top_k_on_a_long_row_keeps_exactly_k_lower_ids_first():
    logits = jnp.zeros((2, 3000)).at[0, 2500].set(1.0).at[1, 7].set(-1.0)
    kept = np.asarray(decoding.filter_top_k(logits, 4) > decoding.FILTERED)
    np.testing.assert_array_equal(np.flatnonzero(kept[0]), [0, 1, 2, 2500])
    np.testing.assert_array_equal(np.flatnonzero(kept[1]), [0, 1, 2, 3])


def test_filter_top_k_breaks_ties_by_index():
    logits = jnp.array([[1.0, 3.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    kept = np.asarray(decoding.filter_top_k(logits, 2) > decoding.FILTERED)
    np.testing.assert_array_equal(kept, [[0, 1, 1, 0], [1, 1, 0, 0]])  # exactly k, lower ids


@pytest.mark.parametrize(
    "probs, p, want",
    [
        ([0.4, 0.2, 0.2, 0.2], 0.5, [1, 1, 0, 0]),  # a tie at the threshold: keep what p needs
        ([0.2, 0.2, 0.4, 0.2], 0.5, [1, 0, 1, 0]),  # ... the lower id among the tied
        ([0.25, 0.25, 0.25, 0.25], 0.5, [1, 1, 0, 0]),  # uniform logits are filtered too
        ([0.25, 0.25, 0.25, 0.25], 0.51, [1, 1, 1, 0]),
        ([0.5, 0.25, 0.125, 0.125], 0.75, [1, 1, 0, 0]),  # exact dyadic boundary: mass >= p
        ([0.125, 0.5, 0.125, 0.25], 0.75, [0, 1, 0, 1]),  # the same, out of rank order
        ([0.125, 0.5, 0.125, 0.25], 0.76, [1, 1, 0, 1]),
    ],
)
def test_filter_top_p_tie_rule_and_boundary(probs, p, want):
    logits = jnp.log(jnp.array([probs]))
    kept = np.asarray(decoding.filter_top_p(logits, p) > decoding.FILTERED)
    np.testing.assert_array_equal(kept[0], want)


def _renormalised(logits, temperature, top_k, top_p):
    """The sampling distribution written out in numpy: softmax(z / T), top-k, then top-p."""
    probs = np.exp(np.asarray(logits, np.float64) / temperature)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(len(probs), bool)
    keep[order[:top_k]] = True
    probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    mass_above = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(len(probs), bool)
    keep[order[mass_above < top_p]] = True
    return np.where(keep, probs, 0.0) / probs[keep].sum()


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 4, 1.0), (0.7, 5, 0.8)]
)
def test_sampled_frequencies_follow_the_renormalised_distribution(temperature, top_k, top_p):
    logits = jnp.array([2.0, 1.5, 1.0, 0.3, 0.0, -0.5])
    draws = 20_000
    tokens = jax.jit(
        functools.partial(decoding.sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
    )(jnp.tile(logits, (draws, 1)), jax.random.key(11))
    frequencies = np.bincount(np.asarray(tokens), minlength=6) / draws
    want = _renormalised(logits, temperature, top_k or 6, top_p)
    # 20k draws: the standard error of a frequency is at most 0.0036; allow about 4 of them.
    np.testing.assert_allclose(frequencies, want, atol=0.015)
    assert frequencies[want == 0].sum() == 0


def test_decode_loop_stops_at_eos_and_pads_finished_rows():
    # Stub model: the logits of position t (the token fed there is ignored) are fixed; row 0 says
    # EOS (2) at t = 1, row 1 at t = 3.
    wanted = jnp.array([[5, 2, 7, 8, 9], [6, 7, 8, 2, 9]], jnp.int32)  # [B, T]
    table = jax.nn.one_hot(wanted.T, 10) * 10.0  # [T, B, V]

    def step_fn(tokens, positions, cache):
        return table[positions[0, 0]], cache + 1

    out = decoding.decode_loop(
        step_fn,
        jnp.zeros((), jnp.int32),
        jnp.ones(2, jnp.int32),  # BOS, fed at position 0
        max_length=5,
        eos_id=2,
        choose=lambda logits, t: jnp.argmax(logits, -1),
    )
    np.testing.assert_array_equal(out, [[5, 2, 0, 0, 0], [6, 7, 8, 2, 0]])
    forced = decoding.decode_loop(
        step_fn,
        jnp.zeros((), jnp.int32),
        jnp.ones(2, jnp.int32),  # BOS, fed at position 0
        max_length=5,
        eos_id=2,
        choose=lambda logits, t: jnp.argmax(logits, -1),
        prompts=jnp.array([[2, 3], [4, 0]], jnp.int32),
        prompt_lengths=jnp.array([2, 1]),
    )
    # A prompt EOS does not end row 0; generation resumes at t = 2.
    np.testing.assert_array_equal(forced, [[2, 3, 7, 8, 9], [4, 7, 8, 2, 0]])


def test_generate_rejects_bad_arguments():
    model, params = _model()
    base = dict(max_length=4, eos_id=2)
    with pytest.raises(ValueError, match="rng"):
        decoding.generate(model, params, inputs=SRC, temperature=1.0, **base)
    with pytest.raises(ValueError, match="inputs"):
        decoding.generate(model, params, prompts=SRC, **base)
    with pytest.raises(ValueError, match="temperature"):
        decoding.generate(model, params, inputs=SRC, temperature=-1.0, **base)


def test_sampled_sliding_continuation_draws_step_t_with_fold_in_rng_t():
    # Past the trained length, token t is categorical(fold_in(rng, t), logits_t / T), where
    # logits_t are the model's over BOS + the previous `context` tokens (written out here).
    model, params = _model("decoder_only", positional="learned")
    context, length, temperature = 5, 14, 1.5
    tokens, rng = jnp.array([[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]], jnp.int32), jax.random.key(7)
    slide = _jit(
        functools.partial(
            decoding.generate_sliding,
            model,
            max_length=length,
            context=context,
            eos_id=NO_EOS,
            temperature=temperature,
        )
    )
    out = np.asarray(slide(params, tokens, rng=rng))
    apply = _jit_apply(model)
    want, argmax = np.zeros((2, length), np.int32), np.zeros((2, length), np.int32)
    want[:, :context] = argmax[:, :context] = tokens
    for t in range(context, length):
        windows = np.pad(want[:, t - context : t], ((0, 0), (0, 1)))  # [B, context + 1]
        logits = apply({"params": params}, jnp.asarray(windows))[:, context]  # [B, V]
        key = jax.random.fold_in(rng, t)
        want[:, t] = jax.random.categorical(key, logits / temperature, axis=-1)
        argmax[:, t] = jnp.argmax(logits, axis=-1)
    np.testing.assert_array_equal(out, want)
    assert (want != argmax).any()  # the draws are samples, not greedy choices


def test_choose_fn_samples_softmax_of_the_logits_over_the_temperature():
    # 20,000 steps of one choose fn in one vmapped call: the keys fold_in(rng, t) are
    # independent draws, so the frequencies are those of softmax(logits / T).
    logits = np.array([2.0, 1.5, 1.0, 0.3, 0.0, -0.5], np.float32)
    draws = 20_000
    for temperature in (0.5, 2.0):
        choose = decoding.make_choose_fn(
            temperature=temperature, top_k=0, top_p=1.0, rng=jax.random.key(13)
        )
        tokens = _jit(jax.vmap(lambda t, c=choose: c(jnp.asarray(logits)[None], t)[0]))(
            jnp.arange(draws)
        )
        frequencies = np.bincount(np.asarray(tokens), minlength=6) / draws
        want = np.exp(logits.astype(np.float64) / temperature)
        # 20k draws: a frequency's standard error is at most 0.0036; allow about 4 of them.
        np.testing.assert_allclose(frequencies, want / want.sum(), atol=0.015)


def test_sampled_generate_draws_step_t_from_the_logits_over_the_temperature():
    # Cached sampled generation against the uncached model, step by step: token t is
    # categorical(fold_in(rng, t), logits_t / T) once the prompt is used up.
    model, params = _model("decoder_only", positional="rotary")
    temperature, length, rng = 1.5, 10, jax.random.key(4)
    prompts = jnp.array([[4, 5], [8, 9]], jnp.int32)
    sample = _jit_generate(model, max_length=length, eos_id=NO_EOS, temperature=temperature)
    out = np.asarray(sample(params, prompts=prompts, rng=rng))
    apply = _jit_apply(model)
    want, argmax = np.zeros((2, length), np.int32), np.zeros((2, length), np.int32)
    want[:, :2] = argmax[:, :2] = prompts
    for t in range(2, length):
        logits = apply({"params": params}, jnp.asarray(want))[:, t]  # [B, V]
        key = jax.random.fold_in(rng, t)
        want[:, t] = jax.random.categorical(key, logits / temperature, axis=-1)
        argmax[:, t] = jnp.argmax(logits, axis=-1)
    np.testing.assert_array_equal(out, want)
    assert (want != argmax).any()  # the draws are samples, not greedy choices
