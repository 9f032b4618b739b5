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
    """Vaswani et al. 2017 eq. (3) at s = step + 1, as tfjax's `optim.paper_schedule`."""

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
        cache = model.init(
            jax.random.key(0),
            encoded,
            inputs_segment_ids,
            jnp.zeros((batch, length), jnp.int32),
            jnp.arange(length),
            None,
            False,
            method=Transformer.decode_tokens,
        )["cache"]  # keys and values [B, L, N, H] per self-attention layer, index 0

        def step(t, carry):
            tokens, cache, previous = carry
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
            token = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)  # [B]
            return tokens.at[:, t].set(token), state["cache"], token

        start = (jnp.zeros((batch, length), jnp.int32), cache, jnp.ones((batch,), jnp.int32))
        tokens, _, _ = jax.lax.fori_loop(0, length, step, start)
        return tokens

    return jax.jit(decode)
