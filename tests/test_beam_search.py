"""tfjax.inference.beam_search: length penalty, beam 1 = greedy, beam >= greedy, n-best order."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.inference import beam_search, decoding

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
MAX_LENGTH = 8
# Compiling dominates these tests on CPU; XLA's backend optimisation level 0 halves it.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def _setup():
    """Model, params and an EOS id that greedy decoding emits at t = 3 of row 0."""
    model = models.create_model(models.ModelConfig(**TINY))
    params = _jit(model.init)(jax.random.key(0), SRC, SRC)["params"]
    greedy = functools.partial(decoding.greedy_decode, model, max_length=MAX_LENGTH, eos_id=-1)
    raw = _jit(greedy)(params, SRC, inputs_segment_ids=SRC_SEG)
    return model, params, int(raw[0, 3])


def _greedy(model, params, eos):
    generate = functools.partial(decoding.generate, model, max_length=MAX_LENGTH, eos_id=eos)
    return _jit(generate)(params, inputs=SRC, inputs_segment_ids=SRC_SEG)  # [B, L]


def _beam(model, params, eos, **options):
    search = functools.partial(
        beam_search.beam_search, model, max_length=MAX_LENGTH, eos_id=eos, **options
    )
    return _jit(search)(params, SRC, inputs_segment_ids=SRC_SEG)


def test_length_penalty_matches_written_out_values():
    # ((5 + |Y|) / 6)^alpha, Wu et al. 2016, §7.
    np.testing.assert_allclose(beam_search.length_penalty(1, 0.6), 1.0)
    np.testing.assert_allclose(beam_search.length_penalty(7, 0.6), 2.0**0.6, rtol=1e-6)
    np.testing.assert_allclose(beam_search.length_penalty(4, 0.6), 1.2754245, rtol=1e-6)
    np.testing.assert_allclose(beam_search.length_penalty(3, 1.0), 8.0 / 6.0, rtol=1e-6)
    np.testing.assert_allclose(beam_search.length_penalty(jnp.array([2, 9]), 0.0), [1.0, 1.0])


def test_beam_size_1_without_length_penalty_is_greedy():
    model, params, eos = _setup()
    seqs, _ = _beam(model, params, eos, beam_size=1, alpha=0.0)
    greedy = _greedy(model, params, eos)
    assert (greedy == eos).any()
    np.testing.assert_array_equal(seqs[:, 0], greedy)


@pytest.mark.parametrize("cache_start", [0, 1])
def test_beam_search_scores_are_the_models_sorted_and_never_below_greedy(cache_start):
    # 0: one loop over 8 slots; 1: the cache grows 1, 2, 4, 8 slots, reordered in each.
    model, params, eos = _setup()
    alpha = 0.6
    seqs, scores = _beam(
        model, params, eos, beam_size=4, alpha=alpha, num_return=4, cache_start=cache_start
    )
    assert seqs.shape == (2, 4, MAX_LENGTH) and scores.shape == (2, 4)
    # Row 0 finishes 4 hypotheses; row 1 only 1 (this random model likes token 0), so the
    # best unfinished ones, run to max_length, fill its n-best list.
    np.testing.assert_array_equal((seqs == eos).sum(-1), [[1, 1, 1, 1], [1, 0, 0, 0]])
    greedy = _greedy(model, params, eos)
    candidates = jnp.concatenate([seqs.reshape(8, MAX_LENGTH), greedy], axis=0)  # [10, L]
    inputs = jnp.concatenate([jnp.repeat(SRC, 4, axis=0), SRC], axis=0)
    segments = (inputs > 0).astype(jnp.int32)
    score = functools.partial(beam_search.sequence_log_prob, model, eos_id=eos)
    log_probs = _jit(score)(params, inputs, candidates, inputs_segment_ids=segments)
    model_scores = log_probs / beam_search.length_penalty(
        beam_search.sequence_lengths(candidates, eos), alpha
    )
    np.testing.assert_allclose(model_scores[:8].reshape(2, 4), scores, atol=1e-4)
    assert (np.diff(np.asarray(scores), axis=1) <= 1e-6).all()  # best first
    assert (scores[:, 0] >= model_scores[8:] - 1e-5).all()
    assert len({tuple(np.asarray(s)) for s in seqs[0]}) == 4  # n distinct hypotheses


def test_reorder_cache_gathers_rows_and_leaves_scalars():
    cache = {"k": jnp.arange(6.0).reshape(6, 1), "cache_index": jnp.array(3, jnp.int32)}
    out = beam_search.reorder_cache(cache, jnp.array([[2, 2, 0], [1, 0, 0]]))
    np.testing.assert_array_equal(out["k"][:, 0], [2, 2, 0, 4, 3, 3])
    assert out["cache_index"] == 3


def test_reorder_cache_leaves_cross_attention_keys_in_place():
    cross = jnp.arange(2.0).reshape(2, 1)  # one row per source, shared by its 3 beams
    cache = {"layer": {"cached_key": jnp.arange(6.0).reshape(6, 1), "cached_cross_key": cross}}
    out = beam_search.reorder_cache(cache, jnp.array([[2, 2, 0], [1, 0, 0]]))
    np.testing.assert_array_equal(out["layer"]["cached_key"][:, 0], [2, 2, 0, 4, 3, 3])
    np.testing.assert_array_equal(out["layer"]["cached_cross_key"], cross)


def test_the_search_tiles_the_self_attention_cache_and_shares_the_cross_attention_one():
    model, params, _ = _setup()
    state, _ = beam_search._start_search(
        model, params, SRC, SRC_SEG, beam_size=3, max_length=MAX_LENGTH, bos_id=None
    )
    rows = {
        jax.tree_util.keystr(path): x.shape[0]
        for path, x in jax.tree_util.tree_leaves_with_path(state.cache)
        if x.ndim
    }
    self_rows = {rows[k] for k in rows if "cached_cross_" not in k}
    cross_rows = {rows[k] for k in rows if "cached_cross_" in k}
    assert self_rows == {2 * 3} and cross_rows == {2}, rows  # B * W and B


def _state(**fields) -> beam_search.BeamState:
    b, w, length = 1, 2, 3
    defaults = dict(
        t=jnp.array(2, jnp.int32),
        alive_seqs=jnp.array([[[4, 5, 0], [6, 7, 0]]], jnp.int32),
        alive_log_probs=jnp.array([[-1.0, -2.0]]),
        finished_seqs=jnp.array([[[4, 2, 0], [0, 0, 0]]], jnp.int32),
        finished_scores=jnp.array([[-0.5, beam_search.NEG]]),
        finished_flags=jnp.array([[True, False]]),
        cache=jnp.zeros((b * w, 1)),
        logits=jnp.zeros((b * w, 10)),
    )
    assert defaults["alive_seqs"].shape == (b, w, length)
    return beam_search.BeamState(**{**defaults, **fields})


def test_finalise_fills_missing_finished_hypotheses_with_the_best_alive():
    seqs, scores = beam_search.finalise(_state(), num_return=2, alpha=0.0)
    np.testing.assert_array_equal(seqs, [[[4, 2, 0], [4, 5, 0]]])
    np.testing.assert_allclose(scores, [[-0.5, -1.0]])


def test_stops_once_no_alive_beam_can_beat_the_worst_finished():
    running = functools.partial(beam_search.should_continue, max_length=5, alpha=0.0)
    assert running(_state())  # a finished slot is still empty
    full = dict(finished_flags=jnp.array([[True, True]]))
    assert not running(_state(finished_scores=jnp.array([[-0.5, -0.9]]), **full))
    assert running(_state(finished_scores=jnp.array([[-0.5, -1.1]]), **full))


def test_stopping_bound_uses_the_longest_reachable_length_with_alpha():
    # alpha = 1: the best alive beam (log-prob -1 at t = 2) can still reach -1 / lp(5) = -0.6,
    # better than the worst finished -0.7, so the search goes on; a bound with lp(t) (-0.857)
    # would have stopped it. Against a worst finished -0.5 it stops.
    running = functools.partial(beam_search.should_continue, max_length=5, alpha=1.0)
    full = dict(finished_flags=jnp.array([[True, True]]))
    assert (
        -1.0 / beam_search.length_penalty(2, 1.0) < -0.7 < -1.0 / beam_search.length_penalty(5, 1.0)
    )
    assert running(_state(finished_scores=jnp.array([[-0.5, -0.7]]), **full))
    assert not running(_state(finished_scores=jnp.array([[-0.3, -0.5]]), **full))


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_exhaustive_beam_equals_brute_force_enumeration(alpha):
    # Vocabulary 6, length 3: with a beam as wide as every candidate nothing is pruned, so the
    # n-best list must be every EOS-terminated sequence, ranked by log P(Y|X) / lp(|Y|) computed
    # here from teacher-forced logits.
    vocab, length, eos = 6, 3, 2
    model = models.create_model(models.ModelConfig(**{**TINY, "vocab_size": vocab}))
    src = jnp.array([[5, 4, 3, 3]], jnp.int32)
    params = _jit(model.init)(jax.random.key(3), src, src)["params"]
    others = [t for t in range(vocab) if t != eos]
    hypotheses = [
        (*prefix, eos) + (0,) * (length - 1 - len(prefix))
        for n in range(length)
        for prefix in itertools.product(others, repeat=n)
    ]  # 1 + 5 + 25 sequences
    targets = jnp.array(hypotheses, jnp.int32)
    logits = model.apply({"params": params}, jnp.repeat(src, len(hypotheses), 0), targets)
    log_p = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)), np.float64)
    scores = []
    for row, hypothesis in zip(log_p, hypotheses, strict=True):
        size = hypothesis.index(eos) + 1
        total = sum(row[i, hypothesis[i]] for i in range(size))
        scores.append(total / ((5.0 + size) / 6.0) ** alpha)
    order = np.argsort(scores)[::-1]
    width = vocab**length  # every candidate of every step fits in the beam
    search = functools.partial(
        beam_search.beam_search,
        model,
        max_length=length,
        eos_id=eos,
        beam_size=width,
        alpha=alpha,
        num_return=len(hypotheses),
    )
    seqs, got = _jit(search)(params, src)
    np.testing.assert_allclose(got[0], np.asarray(scores)[order], rtol=1e-5, atol=1e-5)
    assert [tuple(s) for s in np.asarray(seqs[0])] == [hypotheses[i] for i in order]


def test_beam_search_rejects_bad_options():
    model, params, eos = _setup()
    with pytest.raises(ValueError, match="num_return"):
        beam_search.beam_search(model, params, SRC, max_length=4, eos_id=eos, num_return=5)
    lm = models.create_model(models.ModelConfig(**{**TINY, "kind": "decoder_only"}))
    with pytest.raises(ValueError, match="encoder_decoder"):
        beam_search.beam_search(lm, params, SRC, max_length=4, eos_id=eos)
