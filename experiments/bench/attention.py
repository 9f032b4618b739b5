"""The `attention` sub-benchmark: attention's forward + backward as the length grows.

Batch 1, 4 heads of 64, lengths 256 to 8192, three variants of one attention layer: full
attention, the dense sliding-window mask (radius 64, still O(L^2)) and the blocked local
attention of `tfjax.nn.attention.local_attention` (O(L * r)), each with XLA's temporary memory.
Then a whole model: a 2-layer encoder (`encoder_only`, D = 256, T5 relative positions) with
`window_radius=64` (the blocked path) and without a window, lengths 512 to 4096. Not in the
default `--bench` list: about two minutes on CPU.
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing
from tfjax import models
from tfjax.nn import attention, masking

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
RADIUS = 64
HEADS = 4
HEAD_DIM = 64
VARIANTS = ("full", "window_mask", "local_blocked")
ENCODER_LENGTHS = (512, 1024, 2048, 4096)
ENCODER_VARIANTS = {"encoder_window": RADIUS, "encoder_dense": 0}


def _attention_variant(name: str, length: int):
    """(jitted fwd+bwd function, q, k, v) of one attention layer on [1, L, 4, 64]."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, length, HEADS, HEAD_DIM)) for i in range(3))
    if name == "local_blocked":
        fn = lambda q, k, v: attention.local_attention(q, k, v, radius=RADIUS)  # noqa: E731
    else:
        mask = masking.window_mask(length, RADIUS) if name == "window_mask" else None
        fn = lambda q, k, v: attention.dot_product_attention(  # noqa: E731
            q, k, v, mask=mask, implementation="reference"
        )
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2)))
    return grad, q, k, v


def _encoder_variant(radius: int, length: int):
    """(jitted fwd+bwd function, params, tokens) of a 2-layer encoder over [1, L] tokens."""
    cfg = models.ModelConfig(
        kind="encoder_only",
        vocab_size=1000,
        embed_dim=HEADS * HEAD_DIM,
        num_layers=2,
        num_heads=HEADS,
        mlp_dim=4 * HEADS * HEAD_DIM,
        max_len=length,
        dropout_rate=0.0,
        positional="relative",
        window_radius=radius,
    )
    model = models.create_model(cfg)
    tokens = jax.random.randint(jax.random.key(0), (1, length), 3, cfg.vocab_size)
    params = model.init(jax.random.key(1), tokens)["params"]
    loss = lambda p, t: jnp.sum(model.apply({"params": p}, t) ** 2)  # noqa: E731
    return jax.jit(jax.grad(loss)), params, tokens


def _length_row(name: str, length: int, repeats: int, warmup: int) -> dict:
    """Seconds, tokens/s and XLA temp bytes of variant `name` at one length."""
    if name in ENCODER_VARIANTS:
        grad, *args = _encoder_variant(ENCODER_VARIANTS[name], length)
    else:
        grad, *args = _attention_variant(name, length)
    memory = grad.lower(*args).compile().memory_analysis()
    _, times = timing.time_calls(lambda: grad(*args), repeats, warmup)
    return {
        "length": length,
        "seconds_median": statistics.median(times),
        "tokens_per_second": timing.rates(length, times),
        "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
    }


def bench_attention(repeats: int, batch: int, dtype: str, warmup: int = 1) -> dict:
    """Forward + backward as the length grows: one attention layer (full, window, blocked), and
    a 2-layer encoder with and without `window_radius`.

    `batch` and `dtype` are ignored (batch 1, float32), so that every sub-benchmark takes the
    same arguments.
    """
    del batch, dtype
    out = {"bench": "attention", "radius": RADIUS, "heads": HEADS, "head_dim": HEAD_DIM}
    for name in VARIANTS:
        out[name] = [_length_row(name, length, repeats, warmup) for length in LENGTHS]
    for name in ENCODER_VARIANTS:
        out[name] = [_length_row(name, length, repeats, warmup) for length in ENCODER_LENGTHS]
    return out
