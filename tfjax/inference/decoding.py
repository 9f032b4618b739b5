"""Autoregressive decoding: KV-cached greedy and sampled generation, and an uncached reference.

- `init_cache`, `prefill`, `make_step_fn`: the model's zero "cache" collection, the same with
  the encoder run and its keys/values projected once per source, and one cached step (the
  loops feed BOS through it themselves).
- `decode_loop`, `generate`: greedy (temperature 0) or sampled generation in a
  `lax.while_loop` over the cache (Vaswani et al. 2017, §3.2.3, one position at a time);
  encoder-decoder models translate `inputs`, decoder-only models continue `prompts`; with
  `cache_start` the self-attention cache starts short and doubles as it fills
  (`cache_phases`, one loop per size).
- `filter_top_k`, `filter_top_p`, `sample_logits`, `make_choose_fn`: pure sampling helpers
  (top-k: Fan et al. 2018, §5.4; nucleus / top-p: Holtzman et al. 2020, §3.1).
- `greedy_decode` recomputes the decoder over the whole prefix at every step (O(L^2) work); it
  serves evaluation during training and is the reference for the cached decoder.
Beam search lives in `tfjax.inference.beam_search`. Everything here is traceable: jit it with
`functools.partial` over the model and the Python-valued options (max_length, eos_id, ...).
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from tfjax.models import kinds
from tfjax.nn import losses, positional
from tfjax.nn.attention import cache as kv_cache

# Filtered-out logits: finite (never -inf) so that softmax and categorical stay NaN-free.
FILTERED = float(jnp.finfo(jnp.float32).min)

StepFn = Callable[[Array, Array, Any], tuple[Array, Any]]


def after_eos(tokens: Int[Array, "B L"], eos_id: int) -> Bool[Array, "B L"]:
    """True at every position after the first EOS of a row."""
    seen = jnp.cumsum(tokens == eos_id, axis=1)  # [B, L]
    return (seen - (tokens == eos_id)) > 0


def check_model(model: nn.Module, decodings: tuple[str, ...], max_length: int) -> str:
    """Returns how the model's kind decodes (`kinds.ModelKind.decoding`: "source" or
    "prompt"); ValueError unless that is one of `decodings` and max_length fits."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "kind", None)
    found = kinds.get(kind).decoding if kind in kinds.names() else None
    if found not in decodings:
        allowed = tuple(name for d in decodings for name in kinds.names(decoding=d))
        raise ValueError(f"model must be one of the kinds {allowed}, got {kind!r}")
    check_lengths(model, max_length)
    return found


def check_lengths(model: nn.Module, max_length: int) -> None:
    """ValueError unless 1 <= max_length (<= the learned position table's size)."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    cfg = model.config
    if cfg.positional == "learned" and max_length > cfg.max_len:
        raise ValueError(f"max_length {max_length} exceeds the learned table's {cfg.max_len}")


# ---------------------------------------------------------------------------------------------
# The cache and one step.


def init_cache(
    model: nn.Module,
    params: Any,
    *,
    batch_size: int,
    max_length: int,
    source_length: int | None = None,
) -> Any:
    """The model's "cache" collection, all zeros (shapes only are computed, with `eval_shape`).

    Args:
      model: an `EncoderDecoder` or a `DecoderOnly`.
      params: its parameters.
      batch_size: B.
      max_length: self-attention cache slots (the longest target / sequence decoded).
      source_length: S of the encoder output (encoder-decoder models only).

    Returns:
      pytree of zeros: per decoder layer "cached_key"/"cached_value" [B, K, max_length, H] and
      "cache_index" [] int32 (plus "cached_cross_key"/"cached_cross_value" [B, K, S, H]); in a
      scanned stack (`ModelConfig.scan_layers`) one such set under "layers", each array with a
      leading [num_layers] axis.

    Raises:
      ValueError: for another model kind, a missing source_length or max_length < 1.
    """
    decoded = check_model(model, ("source", "prompt"), max_length)
    tokens = jnp.zeros((batch_size, max_length), jnp.int32)
    kwargs = {"positions": positional.default_positions(tokens)}
    if decoded == "source":
        if source_length is None:
            raise ValueError("init_cache needs source_length for an encoder-decoder model")
        cfg = model.config
        shape = (batch_size, source_length, cfg.embed_dim)
        kwargs["encoded"] = jnp.zeros(shape, cfg.compute_dtype)  # [B, S, D]

    def create(params, tokens, kwargs):
        apply = functools.partial(model.apply, method=model.decode_step, mutable=["cache"])
        return apply({"params": params}, tokens, **kwargs)[1]["cache"]

    # Arguments, not closures: traced inputs keep the model's concrete-value checks off.
    shapes = jax.eval_shape(create, params, tokens, kwargs)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _apply_step(model: nn.Module, params: Any, cache: Any, tokens, positions, **extra):
    """One `decode_step` -> (float32 logits [B, V] of the last new position, new cache)."""
    variables = {"params": params, "cache": cache}
    logits, state = model.apply(
        variables,
        tokens,
        positions=positions,
        method=model.decode_step,
        mutable=["cache"],
        **extra,
    )
    return logits[:, -1].astype(jnp.float32), state["cache"]


def make_step_fn(
    model: nn.Module, params: Any, inputs_segment_ids: Int[Array, "B S"] | None = None
) -> StepFn:
    """step_fn(tokens [B, 1], positions [B, 1], cache) -> (logits [B, V] float32, cache).

    The cross-attention keys must already be cached (see `prefill`).
    """
    extra = {} if inputs_segment_ids is None else {"inputs_segment_ids": inputs_segment_ids}
    return lambda tokens, positions, cache: _apply_step(
        model, params, cache, tokens, positions, **extra
    )


def prefill(
    model: nn.Module,
    params: Any,
    *,
    batch_size: int,
    max_length: int,
    inputs: Int[Array, "B S"] | None = None,
    inputs_segment_ids: Int[Array, "B S"] | None = None,
) -> Any:
    """A fresh cache ready for position 0: the encoder (if any) run once and its keys and values
    stored in the cross-attention cache, the self-attention cache empty.

    The decoder runs on zero new tokens ([B, 0]), so only the cross-attention projections do
    any work and the compiled program holds no decoder step: the decoding loops feed BOS
    themselves, so the decoder step is compiled once, in the loop, not also before it
    (docs/performance.md, "Where decoding's compile time goes").
    """
    source_length = None if inputs is None else inputs.shape[1]
    cache = init_cache(
        model, params, batch_size=batch_size, max_length=max_length, source_length=source_length
    )
    if inputs is None:
        return cache
    encoded = model.apply(
        {"params": params}, inputs, inputs_segment_ids=inputs_segment_ids, method=model.encode
    )  # [B, S, D]
    none = jnp.zeros((batch_size, 0), jnp.int32)
    _, state = model.apply(
        {"params": params, "cache": cache},
        none,
        positions=none,
        method=model.decode_step,
        mutable=["cache"],
        encoded=encoded,
        inputs_segment_ids=inputs_segment_ids,
    )
    return state["cache"]


# ---------------------------------------------------------------------------------------------
# Choosing the next token.


# `blocked_top_k` cuts rows of at least 4 k blocks into blocks of this many entries.
TOP_K_BLOCK = 64


def blocked_top_k(
    x: Float[Array, "B N"], k: int, block: int = TOP_K_BLOCK
) -> tuple[Float[Array, "B K"], Int[Array, "B K"]]:
    """`jax.lax.top_k` over the last axis: the same values and indices (ties: lower index first).

    A row of N >= 4 k `block` entries is cut into blocks; the k blocks with the largest
    maxima (ties: lower block first) hold all of the row's top k, since a block left out has k
    blocks ranked above it, each holding an entry that ranks above every entry of the left-out
    block. One max per block and a top-k over those k blocks' entries replace a top-k over the
    whole row: XLA:CPU's TopK is several times slower than a max-reduction over the same
    entries (docs/performance.md). Shorter rows, and `block` 0, go to `jax.lax.top_k`.
    """
    b, n = x.shape
    if block == 0 or n < 4 * k * block:
        return tuple(jax.lax.top_k(x, k))
    blocks = -(-n // block)
    x = jnp.pad(x, ((0, 0), (0, blocks * block - n)), constant_values=-jnp.inf)
    x = x.reshape(b, blocks, block)  # [B, G, block]; padding last, so it loses every tie
    _, chosen = jax.lax.top_k(jnp.max(x, axis=-1), k)  # [B, k]
    chosen = jnp.sort(chosen, axis=-1)  # in row order, so index ties break as in the row
    entries = jnp.take_along_axis(x, chosen[:, :, None], axis=1).reshape(b, k * block)
    values, at = jax.lax.top_k(entries, k)  # [B, k]
    return values, jnp.take_along_axis(chosen, at // block, axis=1) * block + at % block


def _rank_order(logits: Float[Array, "B V"]) -> tuple[Int[Array, "B V"], Int[Array, "B V"]]:
    """(token ids best first, each token's rank): equal logits rank by index, lower first."""
    order = jnp.argsort(-logits, axis=-1, stable=True)  # [B, V]
    return order, jnp.argsort(order, axis=-1)  # the rank is the inverse permutation


def filter_top_k(logits: Float[Array, "B V"], k: int) -> Float[Array, "B V"]:
    """Keeps exactly the k most likely of the [B, V] logits per row; k = 0: all.

    Ties are broken by index (the lower token id is kept), so exactly k tokens stay.
    Returns float32 [B, V]: kept logits unchanged, the others `FILTERED`.
    """
    if k < 0:
        raise ValueError(f"top_k must be >= 0, got {k}")
    logits = logits.astype(jnp.float32)
    if k == 0 or k >= logits.shape[-1]:
        return logits
    _, kept = blocked_top_k(logits, k)  # [B, k]; the lower index among ties
    keep = jnp.zeros(logits.shape, bool).at[jnp.arange(logits.shape[0])[:, None], kept].set(True)
    return jnp.where(keep, logits, FILTERED)


def filter_top_p(logits: Float[Array, "B V"], p: float) -> Float[Array, "B V"]:
    """Nucleus filtering: keeps the smallest set of most likely tokens whose probability >= p.

    Tokens are ranked by probability, equal probabilities by index (lower id first); a token is
    kept when the tokens ranked above it hold < p, so the most likely one always stays
    (Holtzman et al. 2020, §3.1) and a tie at the threshold keeps only as many tied tokens as
    the mass needs (.4/.2/.2/.2 with p = .5 keeps tokens 0 and 1; uniform logits keep ⌈p·V⌉).
    p in (0, 1], 1.0 = all. Returns float32 [B, V]: kept logits unchanged, the others
    `FILTERED`.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    logits = logits.astype(jnp.float32)
    if p == 1.0:
        return logits
    order, ranks = _rank_order(logits)  # [B, V] each
    ranked_probs = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), order, axis=-1)
    mass_above = jnp.cumsum(ranked_probs, axis=-1) - ranked_probs  # [B, V] in rank order
    keep = jnp.take_along_axis(mass_above < p, ranks, axis=-1)  # [B, V] back in token order
    return jnp.where(keep, logits, FILTERED)


def _check_sampling(temperature: float, top_k: int, top_p: float, rng: Array | None) -> None:
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need top_k >= 0 and top_p in (0, 1], got {top_k} and {top_p}")
    if temperature > 0.0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs an rng key")


def sample_logits(
    logits: Float[Array, "B V"],
    rng: Array | None = None,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Int[Array, " B"]:
    """Next tokens [B] int32: argmax when temperature is 0, else a sample from
    softmax(logits / temperature) after top-k and then top-p filtering."""
    _check_sampling(temperature, top_k, top_p, rng)
    if temperature == 0.0:
        return losses.argmax(logits)  # jnp.argmax's result, without XLA:CPU's scalar reduce
    scaled = logits.astype(jnp.float32) / temperature
    scaled = filter_top_p(filter_top_k(scaled, top_k), top_p)
    return jax.random.categorical(rng, scaled, axis=-1).astype(jnp.int32)


def restrict_logits(
    logits: Float[Array, "B V"],
    t: Array | int,
    *,
    max_length: int,
    eos_id: int,
    forbidden_ids: tuple[int, ...] = (),
    force_eos: bool = False,
) -> Float[Array, "B V"]:
    """float32 logits of position t with `forbidden_ids` filtered out and, when `force_eos`, only
    EOS left at the last position (t = max_length - 1). The options reproduce Hugging Face's
    single-token `bad_words_ids` and `forced_eos_token_id`; off, the logits are unchanged."""
    logits = logits.astype(jnp.float32)
    vocab = jnp.arange(logits.shape[-1])  # [V]
    if forbidden_ids:
        logits = jnp.where(jnp.isin(vocab, jnp.asarray(forbidden_ids)), FILTERED, logits)
    if force_eos:
        last = jnp.asarray(t) >= max_length - 1
        logits = jnp.where(last & (vocab != eos_id), FILTERED, logits)
    return logits


def make_choose_fn(
    *, temperature: float, top_k: int, top_p: float, rng: Array | None
) -> Callable[[Array, Array], Array]:
    """choose(logits [B, V], t) -> tokens [B] int32, `decode_loop`'s token choice.

    Argmax when temperature is 0, else `sample_logits` with the key `fold_in(rng, t)`.
    """
    sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)

    def choose(logits, t):
        return sample(logits, None if rng is None else jax.random.fold_in(rng, t))

    return choose


def _with_lengths(
    choose: Callable[[Array, Array], Array], lengths: Int[Array, " B"], eos_id: int
) -> Callable[[Array, Array], Array]:
    """`choose` with EOS forbidden before position lengths[b] and forced at it."""

    def choose_with_lengths(logits, t):
        early = (t < lengths)[:, None] & (jnp.arange(logits.shape[-1]) == eos_id)  # [B, V]
        token = choose(jnp.where(early, -jnp.inf, logits), t)
        return jnp.where(t == lengths, eos_id, token)

    return choose_with_lengths


# ---------------------------------------------------------------------------------------------
# The loop.


def feed(step_fn: StepFn, t: Array, token: Int[Array, " B"], cache):
    """Feeds `token` [B] at position t: (logits [B, V] for position t, the new cache).

    The loops feed BOS at t = 0, then each chosen token at the next position, and stop at
    max_length, so every step's logits are used.
    """
    positions = jnp.full((token.shape[0], 1), t, jnp.int32)  # [B, 1]
    return step_fn(token[:, None], positions, cache)


def cache_phases(max_length: int, start: int) -> tuple[int, ...]:
    """The self-attention slots of a decode's cache, phase by phase: start, 2 start, 4 start, ...
    while at most max_length / 2, then max_length (`start` 0: max_length from the start).

    Step t reads (and beam search copies) every slot of the cache, written or not, so a cache of
    max_length slots from the first step spends much of a long decode on empty slots; one that
    doubles when it fills reads at most twice the written slots. But each phase is its own
    loop to trace and compile, which costs more than it saves unless the compiled decoder runs
    many times over long outputs (docs/performance.md); short decodes (max_length < 2 start)
    keep one loop.
    """
    if start < 0:
        raise ValueError(f"cache start must be >= 0 slots, got {start}")
    phases, slots = [], start
    while 0 < slots <= max_length // 2:
        phases.append(slots)
        slots *= 2
    return (*phases, max_length)


def while_growing(
    cond: Callable[[Any], Array],
    body: Callable[[Any], Any],
    state: Any,
    *,
    grow_to: tuple[int, ...],
    t_of: Callable[[Any], Array],
    cache_of: Callable[[Any], Any],
    with_cache: Callable[[Any, Any], Any],
) -> Any:
    """`lax.while_loop(cond, body, state)` over a self-attention cache that grows as it fills.

    Iteration t feeds position t into the cache (`feed`), so while the cache has T slots the
    loop runs while t < T; then the cache grows (`kv_cache.grow`) to the next length of
    `grow_to` and another loop carries on. After the last growth `cond` alone
    decides. `t_of`, `cache_of` and `with_cache` read t and the cache from the loop state and
    put a new cache in it.

    Raises:
      ValueError: when `grow_to` is not increasing from the cache's slots.
    """
    slots = kv_cache.slots(cache_of(state)) if grow_to else None
    for length in grow_to:
        if slots is None or length <= slots:
            raise ValueError(f"cannot grow a cache of {slots} slots to {length}")
        state = jax.lax.while_loop(lambda s, n=slots: (t_of(s) < n) & cond(s), body, state)
        state = with_cache(state, kv_cache.grow(cache_of(state), length))
        slots = length
    return jax.lax.while_loop(cond, body, state)


def decode_loop(
    step_fn: StepFn,
    cache: Any,
    first_token: Int[Array, " B"],
    *,
    max_length: int,
    eos_id: int,
    choose: Callable[[Array, Array], Array],
    prompts: Int[Array, "B P"] | None = None,
    prompt_lengths: Int[Array, " B"] | None = None,
    grow_to: tuple[int, ...] = (),
) -> Int[Array, "B L"]:
    """Feeds `first_token` at position 0, chooses token t from the logits of position t and
    feeds it at t + 1, until EOS or max_length.

    Args:
      step_fn: (tokens [B, 1], positions [B, 1], cache) -> (logits [B, V], cache).
      cache: a cache with nothing fed yet (see `prefill`), of max_length slots, or of fewer
        with `grow_to`.
      first_token: [B] int, the decoder input at position 0 (BOS).
      max_length: L, positions to produce.
      eos_id: a generated EOS finishes its row; later positions are 0.
      choose: (logits [B, V], t) -> tokens [B] int32 (argmax, or a sample).
      prompts: [B, P] forced tokens (P <= L): token t of row b is prompts[b, t] while
        t < prompt_lengths[b] (prompt EOS tokens do not finish a row).
      prompt_lengths: [B] int; defaults to P for every row.
      grow_to: the self-attention slots the cache grows to as it fills, ending at max_length
        (`cache_phases` after the first; `while_growing`); () for a cache of max_length slots.

    Returns:
      int32 [B, L]: forced and chosen tokens, EOS kept, 0 after it.
    """
    batch = first_token.shape[0]
    if prompts is None and prompt_lengths is not None:
        raise ValueError("prompt_lengths needs prompts")
    if prompts is None:
        prompts = jnp.zeros((batch, 0), jnp.int32)
    if prompts.shape[1] > max_length:
        raise ValueError(f"prompts [B, P] = {prompts.shape} longer than max_length {max_length}")
    if prompt_lengths is None:
        prompt_lengths = jnp.full((batch,), prompts.shape[1], jnp.int32)
    forced_tokens = jnp.pad(prompts, ((0, 0), (0, max_length - prompts.shape[1])))  # [B, L]

    def body(state):
        t, tokens, done, cache, previous = state
        logits, cache = feed(step_fn, t, previous, cache)  # logits of position t
        forced = t < prompt_lengths  # [B]
        prompt_token = jax.lax.dynamic_index_in_dim(forced_tokens, t, axis=1, keepdims=False)
        token = jnp.where(forced, prompt_token, choose(logits, t).astype(jnp.int32))
        token = jnp.where(done, 0, token)  # [B]
        tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, t))
        done = done | ((token == eos_id) & ~forced)
        return t + 1, tokens, done, cache, token

    def cond(state):
        return (state[0] < max_length) & ~jnp.all(state[2])

    tokens = jnp.zeros((batch, max_length), jnp.int32)
    done = jnp.zeros((batch,), bool)
    state = (jnp.zeros((), jnp.int32), tokens, done, cache, first_token.astype(jnp.int32))
    state = while_growing(
        cond,
        body,
        state,
        grow_to=grow_to,
        t_of=lambda state: state[0],
        cache_of=lambda state: state[3],
        with_cache=lambda state, cache: (*state[:3], cache, state[4]),
    )
    return state[1]


def _check_generate_inputs(
    decoded: str, inputs: Int[Array, "B S"] | None, prompts: Int[Array, "B P"] | None
) -> None:
    """ValueError unless an encoder-decoder ("source") gets `inputs` alone, a decoder-only
    ("prompt") `prompts` alone."""
    if decoded == "source" and (inputs is None or prompts is not None):
        raise ValueError("an encoder-decoder model needs `inputs` and no `prompts`")
    if decoded == "prompt" and (prompts is None or inputs is not None):
        raise ValueError("a decoder-only model needs `prompts` ([B, 0] for none) and no `inputs`")


def _start_generation(
    model: nn.Module,
    params: Any,
    *,
    cache_slots: int,
    bos_id: int | None,
    inputs: Int[Array, "B S"] | None,
    inputs_segment_ids: Int[Array, "B S"] | None,
    prompts: Int[Array, "B P"] | None,
) -> tuple[StepFn, Any, Int[Array, " B"]]:
    """Encodes the sources (if any) into a fresh cache of `cache_slots` self-attention slots
    (`prefill`): (step_fn, cache, BOS [B] to feed at position 0).

    B is the row count of `inputs` or, for a decoder-only model, of `prompts`; `bos_id` None
    means `model.config.bos_id`.
    """
    bos_id = model.config.bos_id if bos_id is None else bos_id
    batch = (inputs if prompts is None else prompts).shape[0]
    cache = prefill(
        model,
        params,
        batch_size=batch,
        max_length=cache_slots,
        inputs=inputs,
        inputs_segment_ids=inputs_segment_ids,
    )
    bos = jnp.full((batch,), bos_id, jnp.int32)
    return make_step_fn(model, params, inputs_segment_ids), cache, bos


def generate(
    model: nn.Module,
    params: Any,
    *,
    max_length: int,
    eos_id: int,
    inputs: Int[Array, "B S"] | None = None,
    inputs_segment_ids: Int[Array, "B S"] | None = None,
    prompts: Int[Array, "B P"] | None = None,
    prompt_lengths: Int[Array, " B"] | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: Array | None = None,
    bos_id: int | None = None,
    forbidden_ids: tuple[int, ...] = (),
    force_eos: bool = False,
    lengths: Int[Array, " B"] | None = None,
    cache_start: int = 0,
) -> Int[Array, "B L"]:
    """Greedy or sampled generation with the KV cache.

    Args:
      model: an `EncoderDecoder` (give `inputs`) or a `DecoderOnly` (give `prompts`).
      params: its parameters.
      max_length: L, target positions to produce (decoder-only: the whole sequence, prompt
        included).
      eos_id: a generated EOS ends its row; positions after it are 0.
      inputs: [B, S] source ids; `inputs_segment_ids` [B, S] marks padding with 0.
      prompts: [B, P] right-padded prompts (no BOS) with `prompt_lengths` [B] (default P).
        They are fed through the cache one token per step, then the model continues.
      temperature: 0 = greedy (argmax); > 0 samples from softmax(logits / temperature).
      top_k, top_p: sampling filters (`filter_top_k`, `filter_top_p`); 0 and 1.0 = off.
      rng: PRNG key, required when sampling; step t uses `jax.random.fold_in(rng, t)`.
      bos_id: first decoder input; None = `model.config.bos_id` (as in training).
      forbidden_ids, force_eos: tokens never chosen, and EOS at the last position
        (`restrict_logits`; prompt tokens are forced as given).
      lengths: [B] oracle output lengths (encoder-decoder): row b gets EOS exactly at position
        lengths[b] (< L) and nowhere before, the model choosing every other token. A decoding
        aid for analyses of length generalisation (Newman et al. 2020, "The EOS Decision and
        Length Extrapolation"): results decoded with it must say so. None = the model decides.
      cache_start: 0 = one self-attention cache of max_length slots (one compiled loop); > 0:
        the cache starts with that many slots and doubles as it fills (`cache_phases`, one loop
        per size; the same tokens), for a compiled decoder that runs many long decodes.

    Returns:
      int32 [B, L] token ids, EOS included, 0 after it.

    Raises:
      ValueError: for a bad option, missing or extra inputs/prompts, or another model kind.
    """
    decoded = check_model(model, ("source", "prompt"), max_length)
    if lengths is not None and decoded != "source":
        raise ValueError("lengths (oracle output lengths) is for encoder-decoder models")
    _check_sampling(temperature, top_k, top_p, rng)
    _check_generate_inputs(decoded, inputs, prompts)
    phases = cache_phases(max_length, cache_start)
    step_fn, cache, bos = _start_generation(
        model,
        params,
        cache_slots=phases[0],
        bos_id=bos_id,
        inputs=inputs,
        inputs_segment_ids=inputs_segment_ids,
        prompts=prompts,
    )
    choose = make_choose_fn(temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
    if forbidden_ids or force_eos:
        unrestricted = choose
        restrict = functools.partial(
            restrict_logits,
            max_length=max_length,
            eos_id=eos_id,
            forbidden_ids=tuple(forbidden_ids),
            force_eos=force_eos,
        )
        choose = lambda logits, t: unrestricted(restrict(logits, t), t)  # noqa: E731
    if lengths is not None:
        choose = _with_lengths(choose, lengths, eos_id)
    return decode_loop(
        step_fn,
        cache,
        bos,
        max_length=max_length,
        eos_id=eos_id,
        choose=choose,
        prompts=prompts,
        prompt_lengths=prompt_lengths,
        grow_to=phases[1:],
    )


def generate_sliding(
    model: nn.Module,
    params: Any,
    tokens: Int[Array, "B N"],
    *,
    max_length: int,
    context: int,
    eos_id: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: Array | None = None,
) -> Int[Array, "B L"]:
    """Continues a decoder-only LM past its trained length, re-reading a sliding window.

    Each new token is predicted from BOS followed by the last `context` tokens at positions 0 ..
    `context`, the layout of a training window of `context` + 1 tokens, recomputed without a
    cache (nanoGPT's way of sampling longer than the block size). Use `generate` up to the
    trained length first: at N = `context` the two predict the same next token.

    Args:
      model: a `DecoderOnly`.
      params: its parameters.
      tokens: [B, N] rows to continue, N >= `context` (the output of `generate`).
      max_length: L > N, the length of the returned rows.
      context: tokens the model reads per step (the training windows' length minus one).
      eos_id: a row ends at its first EOS; positions after it are 0.
      temperature, top_k, top_p, rng: as in `generate`; step t uses `fold_in(rng, t)`.

    Returns:
      int32 [B, L]: `tokens` then the continuation, 0 after a row's first EOS.

    Raises:
      ValueError: for another model kind, N < `context` or L <= N.
    """
    check_model(model, ("prompt",), context + 1)
    _check_sampling(temperature, top_k, top_p, rng)
    batch, n = tokens.shape
    if context < 1 or n < context or max_length <= n:
        raise ValueError(
            f"need 1 <= context <= N < max_length, got context {context}, N {n}, "
            f"max_length {max_length}"
        )
    sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
    buffer = jnp.zeros((batch, max_length), jnp.int32).at[:, :n].set(tokens.astype(jnp.int32))

    def step(t, buffer):
        window = jax.lax.dynamic_slice_in_dim(buffer, t - context, context, axis=1)  # [B, C]
        # A trailing 0 target makes the window itself the inputs after BOS; its logits at
        # position C predict token t.
        targets = jnp.pad(window, ((0, 0), (0, 1)))
        logits = model.apply({"params": params}, targets, deterministic=True)[:, context]
        token = sample(logits, None if rng is None else jax.random.fold_in(rng, t))
        return jax.lax.dynamic_update_slice_in_dim(buffer, token[:, None], t, axis=1)

    buffer = jax.lax.fori_loop(n, max_length, step, buffer)
    return jnp.where(after_eos(buffer, eos_id), 0, buffer)


# ---------------------------------------------------------------------------------------------
# Uncached reference.


def greedy_decode(
    model: nn.Module,
    params: Any,
    inputs: Int[Array, "B S"],
    *,
    inputs_segment_ids: Int[Array, "B S"] | None = None,
    max_length: int,
    eos_id: int,
) -> Int[Array, "B L"]:
    """Greedy translation with an encoder-decoder model, without a cache.

    Args:
      model: an `EncoderDecoder`.
      params: its parameters.
      inputs: source ids [B, S]; `inputs_segment_ids` marks padding with 0.
      max_length: L, the number of target positions to produce.
      eos_id: end-of-sequence id; positions after a row's first EOS are set to 0 (padding).

    Returns:
      int32 [B, L] target ids (EOS included, padding after it).
    """
    variables = {"params": params}
    encoded = model.apply(
        variables, inputs, inputs_segment_ids=inputs_segment_ids, method=model.encode
    )
    batch = inputs.shape[0]

    def step(t, tokens):
        logits = model.apply(
            variables, encoded, tokens, inputs_segment_ids=inputs_segment_ids, method=model.decode
        )  # [B, L, V]
        next_token = losses.argmax(logits[:, t])  # [B]
        return tokens.at[:, t].set(next_token)

    tokens = jax.lax.fori_loop(0, max_length, step, jnp.zeros((batch, max_length), jnp.int32))
    return jnp.where(after_eos(tokens, eos_id), 0, tokens)
