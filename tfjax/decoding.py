"""Autoregressive decoding.

`greedy_decode` recomputes the decoder over the whole prefix buffer at every step (O(L^2)
decoder work); it serves evaluation during training and is the reference that a KV-cached
decoder must reproduce.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


def _after_eos(tokens: Int[Array, "B L"], eos_id: int) -> Bool[Array, "B L"]:
    """True at every position after the first EOS of a row."""
    seen = jnp.cumsum(tokens == eos_id, axis=1)  # [B, L]
    return (seen - (tokens == eos_id)) > 0


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
        next_token = jnp.argmax(logits[:, t], axis=-1).astype(jnp.int32)  # [B]
        return tokens.at[:, t].set(next_token)

    tokens = jax.lax.fori_loop(0, max_length, step, jnp.zeros((batch, max_length), jnp.int32))
    return jnp.where(_after_eos(tokens, eos_id), 0, tokens)
