"""Beam search with a length penalty over the KV cache, for encoder-decoder models.

Sources:
- length penalty lp(Y) = ((5 + |Y|) / 6)^alpha, hypotheses ranked by log P(Y|X) / lp(Y): Wu et al.
  2016 (GNMT), §7; beam size 4 and alpha 0.6 for translation: Vaswani et al. 2017, §6.1;
- each step expands every alive beam, keeps the 2W best candidates so that W of them do not end
  in EOS (tensor2tensor's beam search), and finalises an EOS candidate only when it ranks among
  the top W of its step (fairseq, Ott et al. 2019), so beam size 1 with alpha 0 is greedy;
- early stopping: a row is done when its W finished hypotheses all score at least the best
  alive log-prob divided by lp(max_length), the most any alive beam can still reach (log-probs
  only fall, and lp grows with length for alpha >= 0).

Options that reproduce Hugging Face's `generate(num_beams=W, length_penalty=alpha)` (transformers
5, `early_stopping=False`), off by default: `penalty="power"` ranks by log P(Y|X) / |Y|^alpha;
`stopping="heuristic"` ends a row once its W finished hypotheses all score at least the best
alive log-prob divided by |Y|^alpha at the current length (a heuristic, not a bound: a done row
takes no new hypotheses), and at max_length the top W candidates of the last step count as
finished whether or not they end in EOS; `forbidden_ids` are never generated (their logits are
masked before the log-softmax, as `bad_words_ids` with `renormalize_logits`); `force_eos` makes
the last position EOS (`forced_eos_token_id`).

|Y| counts the generated tokens, EOS included (BOS excluded). The encoder runs once per source;
the self-attention cache is tiled to the W beams of the source (rows b * W + i), and every step
reorders it along the batch axis to follow the surviving beams (with `cache_start`, a cache
that starts short and doubles as it fills). The cross-attention keys and values stay one row
per source, read by its W beams together.
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tfjax.inference import decoding
from tfjax.nn.attention import cache as kv_cache

# Log-prob of impossible beams: finite (never -inf) so that sums and divisions stay finite.
NEG = -1.0e7


PENALTIES = ("gnmt", "power")
STOPPINGS = ("bound", "heuristic")


def length_penalty(length: Any, alpha: float, form: str = "gnmt") -> Any:
    """GNMT length penalty ((5 + length) / 6)^alpha (Wu et al. 2016, §7), or length^alpha for
    `form="power"` (Hugging Face's `length_penalty`); length >= 1."""
    length = jnp.asarray(length, jnp.float32)
    return length**alpha if form == "power" else ((5.0 + length) / 6.0) ** alpha


class Rules(NamedTuple):
    """How hypotheses are scored and when the search stops (see the module docstring)."""

    alpha: float = 0.6
    penalty: str = "gnmt"
    stopping: str = "bound"
    forbidden_ids: tuple[int, ...] = ()
    force_eos: bool = False

    def score(self, log_probs: Any, length: Any) -> Any:
        return log_probs / length_penalty(length, self.alpha, self.penalty)


DEFAULT_RULES = Rules()


class BeamState(NamedTuple):
    """Loop state; W = beam size, L = max_length, V = vocabulary."""

    t: Int[Array, ""]  # tokens generated so far
    alive_seqs: Int[Array, "B W L"]
    alive_log_probs: Float[Array, "B W"]  # sorted, best first
    finished_seqs: Int[Array, "B W L"]
    finished_scores: Float[Array, "B W"]  # log-prob / lp(|Y|), sorted, best first
    finished_flags: Bool[Array, "B W"]  # False: an empty slot (score NEG)
    cache: Any  # rows b * W + i
    logits: Float[Array, "BW V"] | None  # next-token logits of every beam (inside a step only)
    done: Bool[Array, " B"] | None = None  # stopping="heuristic": rows that take no more
    previous: Int[Array, " BW"] | None = None  # each beam's last token, fed at position t
    parent: Int[Array, "B W"] | None = None  # the beam each one extends: the cache rows to take


def _gather(x: Array, indices: Array) -> Array:
    """x [B, W, ...] at beam indices [B, W'] -> [B, W', ...]."""
    indices = indices.reshape(indices.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, indices, axis=1)


def _map_beam_rows(fn, cache: Any) -> Any:
    """fn(x, axis) on every self-attention cache array, `axis` its rows (`kv_cache.batch_axis`).

    Scalars stay as they are, and so do the cross-attention keys and values ("cached_cross_*"):
    one row per source, which the W beams of the source read together
    (`kv_cache.attend_over_cache`).
    """

    def apply(path, x):
        name = kv_cache.variable_name(path)
        axis = kv_cache.batch_axis(name, x)
        return x if axis is None or name.startswith("cached_cross_") else fn(x, axis)

    return jax.tree_util.tree_map_with_path(apply, cache)


def reorder_cache(cache: Any, beam_indices: Int[Array, "B W"]) -> Any:
    """Gathers rows b * W + beam_indices[b, i] of the self-attention cache arrays."""
    b, w = beam_indices.shape
    rows = (jnp.arange(b)[:, None] * w + beam_indices).reshape(b * w)  # [B * W]
    return _map_beam_rows(lambda x, axis: jnp.take(x, rows, axis=axis), cache)


def _tile(x: Array, beam_size: int) -> Array:
    """Repeats the rows of x [B, ...] beam_size times (row b -> rows b * W + i)."""
    return jnp.repeat(x, beam_size, axis=0)


def _tile_cache(cache: Any, beam_size: int) -> Any:
    """`_tile` on the rows of the self-attention cache arrays (rows b * W + i)."""
    return _map_beam_rows(lambda x, axis: jnp.repeat(x, beam_size, axis=axis), cache)


def _merge_finished(state: BeamState, seqs, log_probs, is_final, rules: Rules):
    """Adds the candidates that end here (EOS, or max_length reached with stopping="heuristic")
    and rank in the top W of this step to the finished pool; keeps the W best."""
    w = state.finished_scores.shape[1]
    rank_ok = jnp.arange(seqs.shape[1]) < w  # [2W]
    ok = is_final & rank_ok & (log_probs > NEG / 2)  # [B, 2W]
    if state.done is not None:
        ok = ok & ~state.done[:, None]  # a done row takes no more (stopping="heuristic")
    scores = jnp.where(ok, rules.score(log_probs, state.t + 1), NEG)
    all_scores = jnp.concatenate([state.finished_scores, scores], axis=1)  # [B, 3W]
    all_flags = jnp.concatenate([state.finished_flags, ok], axis=1)
    all_seqs = jnp.concatenate([state.finished_seqs, seqs], axis=1)  # [B, 3W, L]
    top_scores, keep = jax.lax.top_k(all_scores, w)  # [B, W]
    return _gather(all_seqs, keep), top_scores, _gather(all_flags, keep)


def beam_step(
    state: BeamState, *, eos_id: int, rules: Rules = DEFAULT_RULES
) -> tuple[BeamState, Int[Array, "B W"], Int[Array, "B W"]]:
    """Selects the next W alive beams and updates the finished pool (pure; no model call).

    Returns:
      (state with t + 1 and without cache/logits updates, parent beam [B, W] of each new alive
      beam, its new token [B, W]).
    """
    b, w, max_length = state.alive_seqs.shape
    logits = decoding.restrict_logits(
        state.logits,
        state.t,
        max_length=max_length,
        eos_id=eos_id,
        forbidden_ids=rules.forbidden_ids,
        force_eos=rules.force_eos,
    )
    log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(b, w, -1)  # [B, W, V]
    vocab = log_probs.shape[-1]
    candidates = (state.alive_log_probs[:, :, None] + log_probs).reshape(b, w * vocab)
    top_lp, top_index = decoding.blocked_top_k(candidates, 2 * w)  # [B, 2W]
    parent, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    seqs = _gather(state.alive_seqs, parent)  # [B, 2W, L]
    seqs = jax.lax.dynamic_update_slice(seqs, token[:, :, None], (0, 0, state.t))
    is_eos = token == eos_id
    is_final = is_eos
    if rules.stopping == "heuristic":  # at max_length every candidate ends (Hugging Face)
        is_final = is_eos | (state.t + 1 >= max_length)
    alive_lp, keep = jax.lax.top_k(jnp.where(is_eos, NEG, top_lp), w)  # [B, W]
    fin_seqs, fin_scores, fin_flags = _merge_finished(state, seqs, top_lp, is_final, rules)
    new_state = state._replace(
        t=state.t + 1,
        alive_seqs=_gather(seqs, keep),
        alive_log_probs=alive_lp,
        finished_seqs=fin_seqs,
        finished_scores=fin_scores,
        finished_flags=fin_flags,
    )
    if rules.stopping == "heuristic":
        new_state = new_state._replace(done=_heuristic_done(new_state, rules))
    return new_state, _gather(parent, keep), _gather(token, keep)


def _heuristic_done(state: BeamState, rules: Rules) -> Bool[Array, " B"]:
    """Rows done under Hugging Face's `early_stopping=False` rule: every finished slot full and
    none worse than the best alive log-prob scored at the current length t (done stays done)."""
    best_alive = rules.score(state.alive_log_probs[:, 0], jnp.maximum(state.t, 1))  # [B]
    worst_finished = jnp.min(state.finished_scores, axis=1)  # [B]
    full = jnp.all(state.finished_flags, axis=1)
    return state.done | (full & ~(best_alive > worst_finished))


def should_continue(
    state: BeamState,
    *,
    max_length: int,
    alpha: float,
    penalty: str = "gnmt",
    stopping: str = "bound",
) -> Bool[Array, ""]:
    """Whether some row can still improve its finished pool (and t < max_length)."""
    if stopping == "heuristic":
        return (state.t < max_length) & ~jnp.all(state.done)
    best_alive = state.alive_log_probs[:, 0] / length_penalty(max_length, alpha, penalty)  # [B]
    worst_finished = jnp.min(state.finished_scores, axis=1)  # NEG while a slot is empty
    done = jnp.all(state.finished_flags, axis=1) & (worst_finished >= best_alive)
    return (state.t < max_length) & ~jnp.all(done)


def finalise(
    state: BeamState, *, num_return: int, alpha: float, penalty: str = "gnmt"
) -> tuple[Int[Array, "B n L"], Float[Array, "B n"]]:
    """The n best finished hypotheses, best first; rows with fewer get the best alive ones."""
    num_finished = jnp.sum(state.finished_flags, axis=1)[:, None]  # [B, 1]
    slot = jnp.arange(num_return)[None, :]  # [1, n]
    use_finished = slot < num_finished  # [B, n]
    alive_slot = jnp.clip(slot - num_finished, 0, state.alive_seqs.shape[1] - 1)  # [B, n]
    lp = length_penalty(jnp.maximum(state.t, 1), alpha, penalty)
    alive_scores = state.alive_log_probs / lp
    seqs = jnp.where(
        use_finished[:, :, None],
        state.finished_seqs[:, :num_return],
        _gather(state.alive_seqs, alive_slot),
    )  # [B, n, L]
    scores = jnp.where(
        use_finished,
        state.finished_scores[:, :num_return],
        jnp.take_along_axis(alive_scores, alive_slot, axis=1),
    )
    return seqs, scores


def _check_options(beam_size: int, rules: Rules, num_return: int) -> None:
    if beam_size < 1 or not 1 <= num_return <= beam_size:
        raise ValueError(f"need 1 <= num_return <= beam_size, got {num_return}, {beam_size}")
    if rules.penalty not in PENALTIES or rules.stopping not in STOPPINGS:
        raise ValueError(
            f"penalty must be one of {PENALTIES} and stopping one of {STOPPINGS}, got "
            f"{rules.penalty!r}, {rules.stopping!r}"
        )
    if rules.alpha < 0.0 and rules.stopping == "bound":
        raise ValueError(f"alpha must be >= 0 (the stopping bound needs it), got {rules.alpha}")


def _initial_state(
    cache: Any, bos_id: int, batch_size: int, beam_size: int, max_length: int
) -> BeamState:
    """W beams per source, each about to be fed BOS; only beam 0 is alive (the others are NEG).

    `cache` holds B rows (`decoding.prefill`); its self-attention arrays are tiled to B * W.
    """
    b, w = batch_size, beam_size
    alive_log_probs = jnp.where(jnp.arange(w) == 0, 0.0, NEG)  # [W]
    return BeamState(
        t=jnp.zeros((), jnp.int32),
        alive_seqs=jnp.zeros((b, w, max_length), jnp.int32),
        alive_log_probs=jnp.broadcast_to(alive_log_probs, (b, w)).astype(jnp.float32),
        finished_seqs=jnp.zeros((b, w, max_length), jnp.int32),
        finished_scores=jnp.full((b, w), NEG, jnp.float32),
        finished_flags=jnp.zeros((b, w), bool),
        cache=_tile_cache(cache, w),
        logits=None,
        done=jnp.zeros((b,), bool),
        previous=jnp.full((b * w,), bos_id, jnp.int32),
        parent=jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (b, w)),
    )


def _start_search(
    model: nn.Module,
    params: Any,
    inputs: Int[Array, "B S"],
    inputs_segment_ids: Int[Array, "B S"] | None,
    *,
    beam_size: int,
    max_length: int,
    bos_id: int | None,
    cache_slots: int | None = None,
) -> tuple[BeamState, decoding.StepFn]:
    """Encodes each source once into a fresh cache (`decoding.prefill`), tiled to W beams per
    source, each about to be fed BOS at position 0.

    The self-attention cache gets `cache_slots` slots (None: max_length).

    Returns:
      (the initial `BeamState`, step_fn over the B * W beams (rows b * W + i)).
    """
    bos_id = model.config.bos_id if bos_id is None else bos_id
    cache = decoding.prefill(
        model,
        params,
        batch_size=inputs.shape[0],
        max_length=max_length if cache_slots is None else cache_slots,
        inputs=inputs,
        inputs_segment_ids=inputs_segment_ids,
    )
    beam_segment_ids = None if inputs_segment_ids is None else _tile(inputs_segment_ids, beam_size)
    step_fn = decoding.make_step_fn(model, params, beam_segment_ids)
    state = _initial_state(cache, bos_id, inputs.shape[0], beam_size, max_length)
    return state, step_fn


def _advance(state: BeamState, step_fn: decoding.StepFn, *, eos_id: int, rules: Rules) -> BeamState:
    """One loop iteration: the cache reordered to the beams kept last (at t = 0 each its own),
    each beam's last token fed through it at position t, then `beam_step` on the logits.

    Reordering just before the step, not after `beam_step`, lets XLA fuse the reorder with the
    step's cache append (one pass over the cache, not a gather and a copy of the loop state).
    """
    cache = reorder_cache(state.cache, state.parent)
    logits, cache = decoding.feed(step_fn, state.t, state.previous, cache)
    state, parent, token = beam_step(
        state._replace(logits=logits, cache=cache), eos_id=eos_id, rules=rules
    )
    return state._replace(logits=None, previous=token.reshape(-1), parent=parent)


def beam_search(
    model: nn.Module,
    params: Any,
    inputs: Int[Array, "B S"],
    *,
    inputs_segment_ids: Int[Array, "B S"] | None = None,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_length: int,
    eos_id: int,
    num_return: int = 1,
    bos_id: int | None = None,
    penalty: str = "gnmt",
    stopping: str = "bound",
    forbidden_ids: tuple[int, ...] = (),
    force_eos: bool = False,
    cache_start: int = 0,
) -> tuple[Int[Array, "B n L"], Float[Array, "B n"]]:
    """Beam search translation with an encoder-decoder model and the KV cache.

    Args:
      model: an `EncoderDecoder`; params: its parameters.
      inputs: [B, S] source ids; `inputs_segment_ids` [B, S] marks padding with 0.
      beam_size: W.
      alpha: length-penalty exponent (0 = rank by log-prob alone).
      max_length: L, the longest target (EOS included).
      eos_id: ends a hypothesis; positions after it are 0.
      num_return: n <= W hypotheses to return per source.
      bos_id: first decoder input; None = `model.config.bos_id`.
      penalty: "gnmt" ((5 + |Y|) / 6)^alpha or "power" |Y|^alpha (`PENALTIES`).
      stopping: "bound" (exact: no alive beam can still enter the finished pool) or
        "heuristic" (Hugging Face's `early_stopping=False`; see the module docstring).
      forbidden_ids: tokens never generated (Hugging Face's single-token `bad_words_ids`).
      force_eos: the last position (L - 1) is EOS (Hugging Face's `forced_eos_token_id`).
      cache_start: 0 = one self-attention cache of max_length slots (one compiled loop); > 0:
        it starts with that many slots and doubles as it fills (`decoding.cache_phases`; the
        same hypotheses), so the per-step reorder copies about the written slots only.

    Returns:
      (int32 [B, n, L] hypotheses, float32 [B, n] scores log P(Y|X) / lp(|Y|)), finished
      hypotheses best first, then (for rows with fewer than n) the best unfinished ones.

    Raises:
      ValueError: for another model kind or bad options.
    """
    decoding.check_model(model, ("source",), max_length)
    rules = Rules(alpha, penalty, stopping, tuple(forbidden_ids), force_eos)
    _check_options(beam_size, rules, num_return)
    phases = decoding.cache_phases(max_length, cache_start)
    state, step_fn = _start_search(
        model,
        params,
        inputs,
        inputs_segment_ids,
        beam_size=beam_size,
        max_length=max_length,
        bos_id=bos_id,
        cache_slots=phases[0],
    )
    state = decoding.while_growing(
        lambda state: should_continue(
            state, max_length=max_length, alpha=alpha, penalty=penalty, stopping=stopping
        ),
        lambda state: _advance(state, step_fn, eos_id=eos_id, rules=rules),
        state,
        grow_to=phases[1:],
        t_of=lambda state: state.t,
        cache_of=lambda state: state.cache,
        with_cache=lambda state, cache: state._replace(cache=cache),
    )
    return finalise(state, num_return=num_return, alpha=alpha, penalty=penalty)


def sequence_log_prob(
    model: nn.Module,
    params: Any,
    inputs: Int[Array, "B S"],
    targets: Int[Array, "B L"],
    *,
    eos_id: int,
    inputs_segment_ids: Int[Array, "B S"] | None = None,
) -> Float[Array, " B"]:
    """log P(targets | inputs) under the (uncached) model, summed up to and including the first
    EOS of each row (the whole row when it has none): the score of given outputs, for n-best
    rescoring or to compare a reference with what the search found.

    Divided by `length_penalty(sequence_lengths(targets, eos_id), alpha)` it is the score
    `beam_search` ranks its hypotheses by, so any candidate can be scored as the search would.

    Args:
        model: an encoder-decoder model whose `apply(variables, inputs, targets, ...)` gives
            [B, L, V] next-token logits (teacher forcing).
        params: its parameters.
        inputs: [B, S] source ids.
        targets: [B, L] output ids (the model shifts them right itself, as in training).
        eos_id: end-of-sequence id; tokens after the first one do not count.
        inputs_segment_ids: [B, S] source segment ids (0 = padding), or None.

    Returns:
        [B] float32 summed log-probabilities.
    """
    logits = model.apply(
        {"params": params}, inputs, targets, inputs_segment_ids=inputs_segment_ids
    )  # [B, L, V]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token_lp = jnp.take_along_axis(log_probs, targets[:, :, None], axis=-1)[:, :, 0]  # [B, L]
    return jnp.sum(jnp.where(decoding.after_eos(targets, eos_id), 0.0, token_lp), axis=1)


def sequence_lengths(targets: Int[Array, "B L"], eos_id: int) -> Int[Array, " B"]:
    """|Y| per row: tokens up to and including the first EOS (L when there is none), the
    length `length_penalty` takes when `sequence_log_prob` is turned into a beam score.

    Args:
        targets: [B, L] output ids.
        eos_id: end-of-sequence id.

    Returns:
        [B] int32 lengths.
    """
    return jnp.sum(~decoding.after_eos(targets, eos_id), axis=1).astype(jnp.int32)
