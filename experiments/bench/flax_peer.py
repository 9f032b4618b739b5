"""The stock-Flax peer of the benchmarks (`python -m experiments.bench --peer=flax`).

The benchmark model written the way a Flax user would write it from Flax's own layers, with no
tfjax code inside: `nn.Embed` (one table for source and target, scaled by sqrt(D), output
tied through `Embed.attend`), the fixed sinusoidal positions of Vaswani et al. 2017 §3.5,
`nn.MultiHeadDotProductAttention` for self- and cross-attention, `nn.Dense` feed-forward with
ReLU, `nn.LayerNorm` after each residual (post-LN, §3.1), `nn.Dropout` on the embeddings and
the residual branches (§5.4), masks from `nn.make_attention_mask` / `nn.make_causal_mask`
built from the segment ids (never from token ids), label-smoothed cross-entropy from
`optax.smooth_labels` + `optax.softmax_cross_entropy` over the non-padding targets, and
`optax.adam(0.9, 0.98, 1e-9)` with the paper's learning-rate schedule (§5.3).

Dropout is the same on both sides: rate `shape["dropout_rate"]` on the embeddings and residual
branches, none on the attention probabilities (tfjax's `attention_dropout_rate` is 0 and Flax's
`dropout_rate` of the attention is set to 0) and none on the feed-forward hidden units. What
still differs is in `NOTES`, which the benchmark prints.

Greedy decoding uses Flax's own cache: the attention layers run with `decode=True` and keep
their keys and values in the "cache" collection, one token per step in a `lax.fori_loop`.
Beam search (`make_beam_decoder`) runs the same cache over K rows per source and reorders
it to the kept beams every step.
"""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

PEER = "flax"
NOTES = (
    "smoothed loss values differ by a constant (optax.smooth_labels spreads eps over V "
    "classes); speed only is compared",
    "the tfjax step also returns token accuracy and the gradient norm (a few reductions)",
)
WARMUP_STEPS = 4000  # tfjax's OptimConfig default
LN_EPSILON = 1e-6


def sinusoids(length: int, dim: int) -> np.ndarray:
    """[L, D] float32: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...) (§3.5)."""
    angles = np.arange(length)[:, None] / 10000.0 ** (np.arange(0, dim, 2) / dim)  # [L, D/2]
    table = np.zeros((length, dim), np.float32)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


class FeedForward(nn.Module):
    mlp_dim: int
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        hidden = nn.relu(nn.Dense(self.mlp_dim, dtype=self.dtype)(x))
        return nn.Dense(x.shape[-1], dtype=self.dtype)(hidden)


class EncoderLayer(nn.Module):
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x, mask, train: bool):
        attention = nn.MultiHeadDotProductAttention(
            num_heads=self.num_heads, dtype=self.dtype, dropout_rate=0.0, deterministic=True
        )
        y = attention(x, x, mask=mask)
        x = nn.LayerNorm(epsilon=LN_EPSILON, dtype=self.dtype)(
            x + nn.Dropout(self.dropout_rate)(y, deterministic=not train)
        )
        y = FeedForward(self.mlp_dim, self.dtype)(x)
        return nn.LayerNorm(epsilon=LN_EPSILON, dtype=self.dtype)(
            x + nn.Dropout(self.dropout_rate)(y, deterministic=not train)
        )


class DecoderLayer(nn.Module):
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    dtype: jnp.dtype
    decode: bool = False

    @nn.compact
    def __call__(self, x, encoded, self_mask, cross_mask, train: bool):
        def attention(decode: bool):
            return nn.MultiHeadDotProductAttention(
                num_heads=self.num_heads,
                dtype=self.dtype,
                dropout_rate=0.0,
                deterministic=True,
                decode=decode,
            )

        def residual(x, y):
            y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
            return nn.LayerNorm(epsilon=LN_EPSILON, dtype=self.dtype)(x + y)

        x = residual(x, attention(self.decode)(x, x, mask=self_mask))
        x = residual(x, attention(False)(x, encoded, mask=cross_mask))
        return residual(x, FeedForward(self.mlp_dim, self.dtype)(x))


class Transformer(nn.Module):
    """Encoder-decoder of `shape`; `decode=True` runs the decoder one token at a time."""

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    max_len: int
    dtype: jnp.dtype = jnp.float32
    decode: bool = False

    def setup(self):
        self.embed = nn.Embed(
            self.vocab_size,
            self.embed_dim,
            embedding_init=nn.initializers.normal(stddev=self.embed_dim**-0.5),
        )
        self.positions = jnp.asarray(sinusoids(self.max_len, self.embed_dim))
        self.dropout = nn.Dropout(self.dropout_rate)
        layer = dict(num_heads=self.num_heads, mlp_dim=self.mlp_dim, dtype=self.dtype)
        self.encoder = [
            EncoderLayer(dropout_rate=self.dropout_rate, **layer) for _ in range(self.num_layers)
        ]
        self.decoder = [
            DecoderLayer(dropout_rate=self.dropout_rate, decode=self.decode, **layer)
            for _ in range(self.num_decoder_layers)
        ]

    def _embed(self, tokens, positions, train: bool):
        x = self.embed(tokens) * math.sqrt(self.embed_dim) + self.positions[positions]
        return self.dropout(x, deterministic=not train).astype(self.dtype)

    def encode(self, inputs, inputs_segment_ids, train: bool = False):
        x = self._embed(inputs, jnp.arange(inputs.shape[1]), train)
        mask = nn.make_attention_mask(inputs_segment_ids > 0, inputs_segment_ids > 0)
        for layer in self.encoder:
            x = layer(x, mask, train)
        return x

    def decode_tokens(self, encoded, inputs_segment_ids, tokens, positions, self_mask, train):
        """Decoder inputs [B, L] at `positions` [L] -> logits [B, L, V] (tied output)."""
        x = self._embed(tokens, positions, train)
        cross_mask = nn.make_attention_mask(jnp.ones(tokens.shape, bool), inputs_segment_ids > 0)
        for layer in self.decoder:
            x = layer(x, encoded, self_mask, cross_mask, train)
        return self.embed.attend(x.astype(jnp.float32))

    def __call__(self, inputs, targets, inputs_segment_ids, targets_segment_ids, train: bool):
        """Teacher-forced logits [B, L, V]: the targets shifted right behind BOS (id 1)."""
        encoded = self.encode(inputs, inputs_segment_ids, train)
        shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=1)[:, :-1]
        valid = targets_segment_ids > 0
        self_mask = nn.combine_masks(
            nn.make_attention_mask(valid, valid), nn.make_causal_mask(targets)
        )
        length = targets.shape[1]
        return self.decode_tokens(
            encoded, inputs_segment_ids, shifted, jnp.arange(length), self_mask, train
        )


def build_model(shape: dict, dtype: str = "float32", decode: bool = False) -> Transformer:
    """The peer for the benchmark's `shape` (`workload.SHAPE`), computing in `dtype`."""
    return Transformer(
        vocab_size=shape["vocab_size"],
        embed_dim=shape["embed_dim"],
        num_layers=shape["num_layers"],
        num_decoder_layers=shape["num_decoder_layers"],
        num_heads=shape["num_heads"],
        mlp_dim=shape["mlp_dim"],
        dropout_rate=shape["dropout_rate"],
        max_len=max(512, shape["source_len"], shape["target_len"]),
        dtype=jnp.dtype(dtype),
        decode=decode,
    )


def paper_schedule(d: int) -> Callable:
    """Vaswani et al. 2017 eq. (3) at s = step + 1, as tfjax's `schedules.paper_schedule`."""

    def schedule(step):
        s = step + 1.0
        return d**-0.5 * jnp.minimum(s**-0.5, s * WARMUP_STEPS**-1.5)

    return schedule


def init_params(model: Transformer, batch: dict) -> dict:
    return jax.jit(model.init, static_argnames="train")(
        jax.random.key(0),
        batch["inputs"],
        batch["targets"],
        batch["inputs_segment_ids"],
        batch["targets_segment_ids"],
        train=False,
    )["params"]


def num_params(shape: dict) -> int:
    """Parameter count of the peer (from shapes only: nothing is initialised)."""
    model = build_model(shape)
    batch = {
        "inputs": jnp.zeros((1, shape["source_len"]), jnp.int32),
        "targets": jnp.zeros((1, shape["target_len"]), jnp.int32),
        "inputs_segment_ids": jnp.ones((1, shape["source_len"]), jnp.int32),
        "targets_segment_ids": jnp.ones((1, shape["target_len"]), jnp.int32),
    }
    abstract = jax.eval_shape(lambda: init_params(model, batch))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract))


def make_train_step(
    shape: dict,
    batch: dict,
    *,
    dtype: str = "float32",
    seed: int = 1,
    learning_rate: float | None = None,
):
    """A closure doing one jitted train step on `batch` (state donated and carried).

    Args:
      shape: the benchmark's model fields (`workload.SHAPE`).
      batch: a `workload.random_batch` dict (int32 numpy).
      dtype: compute dtype (parameters and Adam state stay float32).
      seed: the dropout key's seed (folded with the step).
      learning_rate: None = the paper schedule (what the benchmark uses); a float = constant.

    Returns:
      `step() -> loss` (a jax scalar; the timers wait for it); `step.lower()` lowers it for
      the current state without running it.
    """
    model = build_model(shape, dtype)
    params = init_params(model, batch)
    schedule = paper_schedule(shape["embed_dim"]) if learning_rate is None else learning_rate
    optimizer = optax.adam(schedule, b1=0.9, b2=0.98, eps=1e-9)
    vocab = shape["vocab_size"]

    def loss_fn(params, batch, rng):
        logits = model.apply(
            {"params": params},
            batch["inputs"],
            batch["targets"],
            batch["inputs_segment_ids"],
            batch["targets_segment_ids"],
            train=True,
            rngs={"dropout": rng},
        )  # [B, L, V]
        labels = optax.smooth_labels(jax.nn.one_hot(batch["targets"], vocab), 0.1)
        losses = optax.softmax_cross_entropy(logits, labels)  # [B, L]
        weights = (batch["targets_segment_ids"] > 0).astype(jnp.float32)
        return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)

    def train_step(state, batch, rng):
        params, opt_state, step = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, step))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, step + 1), loss

    step_fn = jax.jit(train_step, donate_argnums=(0,))
    holder = {"state": (params, optimizer.init(params), jnp.zeros((), jnp.int32))}
    rng = jax.random.key(seed)
    data = jax.tree.map(jnp.asarray, batch)

    def run():
        holder["state"], loss = step_fn(holder["state"], data, rng)
        return loss

    run.lower = lambda: step_fn.lower(holder["state"], data, rng)  # AOT, for rss.py
    return run


def _empty_cache(model: Transformer, encoded, inputs_segment_ids, length: int) -> dict:
    """The "cache" collection for decoding `length` tokens per row of `encoded` [R, S, D]:
    keys and values [R, L, N, H] per self-attention layer, index 0."""
    return model.init(
        jax.random.key(0),
        encoded,
        inputs_segment_ids,
        jnp.zeros((encoded.shape[0], length), jnp.int32),
        jnp.arange(length),
        None,
        False,
        method=Transformer.decode_tokens,
    )["cache"]


def _next_logits(model: Transformer, params, cache, encoded, inputs_segment_ids, previous, t):
    """One cached decoder step: the tokens `previous` [R] at position t -> (logits [R, V],
    the updated cache)."""
    logits, state = model.apply(
        {"params": params, "cache": cache},
        encoded,
        inputs_segment_ids,
        previous[:, None],
        t[None],
        None,
        False,
        method=Transformer.decode_tokens,
        mutable=["cache"],
    )
    return logits[:, 0], state["cache"]


def make_greedy_decoder(shape: dict, params: dict, *, dtype: str = "float32"):
    """Jitted KV-cached greedy decoding with Flax's `decode=True` attention cache.

    Returns:
      `decode(params, inputs, inputs_segment_ids) -> tokens [B, L]`, L = `shape["target_len"]`,
      every row decoded to full length (no EOS stop, as the tfjax variants in the bench).
    """
    model = build_model(shape, dtype, decode=True)
    length = shape["target_len"]

    def decode(params, inputs, inputs_segment_ids):
        batch = inputs.shape[0]
        encoded = model.apply(
            {"params": params}, inputs, inputs_segment_ids, method=Transformer.encode
        )
        cache = _empty_cache(model, encoded, inputs_segment_ids, length)

        def step(t, carry):
            tokens, cache, previous = carry
            logits, cache = _next_logits(
                model, params, cache, encoded, inputs_segment_ids, previous, t
            )
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B]
            return tokens.at[:, t].set(token), cache, token

        start = (jnp.zeros((batch, length), jnp.int32), cache, jnp.ones((batch,), jnp.int32))
        tokens, _, _ = jax.lax.fori_loop(0, length, step, start)
        return tokens

    return jax.jit(decode)


def make_beam_decoder(shape: dict, params: dict, beam_size: int, *, dtype: str = "float32"):
    """Jitted KV-cached beam search with Flax's `decode=True` cache, written plainly.

    Each source is repeated `beam_size` times; at every step the K x V continuations of a
    source's K beams are scored by their summed log-probabilities, the best K kept
    (`lax.top_k`), and every cache array reordered to the beams they extend. Every beam runs
    to full length (no EOS, as the tfjax variants in the bench), so no length penalty applies.

    Returns:
      `decode(params, inputs, inputs_segment_ids) -> (tokens [B, K, L], scores [B, K])`, the
      beams best first, L = `shape["target_len"]`.
    """
    model = build_model(shape, dtype, decode=True)
    length, vocab = shape["target_len"], shape["vocab_size"]

    def decode(params, inputs, inputs_segment_ids):
        batch = inputs.shape[0]
        rows = batch * beam_size
        encoded = model.apply(
            {"params": params}, inputs, inputs_segment_ids, method=Transformer.encode
        )
        encoded = jnp.repeat(encoded, beam_size, axis=0)  # [B*K, S, D], beams of a source adjacent
        segments = jnp.repeat(inputs_segment_ids, beam_size, axis=0)
        cache = _empty_cache(model, encoded, segments, length)

        def reorder(x, origin):  # rows of beam `origin[b, k]` of source b, for cache arrays
            if x.ndim == 0:  # the cache index
                return x
            x = x.reshape(batch, beam_size, *x.shape[1:])
            picked = jnp.take_along_axis(x, origin.reshape(origin.shape + (1,) * (x.ndim - 2)), 1)
            return picked.reshape(rows, *x.shape[2:])

        def step(t, carry):
            tokens, scores, cache, previous = carry
            logits, cache = _next_logits(model, params, cache, encoded, segments, previous, t)
            log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))  # [B*K, V]
            candidates = scores[:, :, None] + log_probs.reshape(batch, beam_size, vocab)
            scores, flat = jax.lax.top_k(candidates.reshape(batch, beam_size * vocab), beam_size)
            origin, token = flat // vocab, (flat % vocab).astype(jnp.int32)  # [B, K] each
            tokens = jnp.take_along_axis(tokens, origin[:, :, None], 1).at[:, :, t].set(token)
            cache = jax.tree.map(lambda x: reorder(x, origin), cache)
            return tokens, scores, cache, token.reshape(rows)

        first = jnp.full((batch, beam_size), -jnp.inf).at[:, 0].set(0.0)  # one live beam at first
        start = (
            jnp.zeros((batch, beam_size, length), jnp.int32),
            first,
            cache,
            jnp.ones((rows,), jnp.int32),
        )
        tokens, scores, _, _ = jax.lax.fori_loop(0, length, step, start)
        return tokens, scores

    return jax.jit(decode)
