"""The `attention` sub-benchmark: one attention layer's forward + backward as the length grows.

Batch 1, 4 heads of 64, lengths 256 to 8192, three variants: full attention, the dense
sliding-window mask (radius 64, still O(L^2)) and the blocked local attention of
`tfjax.nn.attention.local_attention` (O(L * r)), each with XLA's temporary memory. Not in the
default `--bench` list: about a minute on CPU.
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing
from tfjax.nn import attention, masking

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
RADIUS = 64
HEADS = 4
HEAD_DIM = 64
VARIANTS = ("full", "window_mask", "local_blocked")


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


def _length_row(name: str, length: int, repeats: int, warmup: int) -> dict:
    """Seconds, tokens/s and XLA temp bytes of variant `name` at one length."""
    grad, q, k, v = _attention_variant(name, length)
    memory = grad.lower(q, k, v).compile().memory_analysis()
    _, times = timing.time_calls(lambda: grad(q, k, v), repeats, warmup)
    return {
        "length": length,
        "seconds_median": statistics.median(times),
        "tokens_per_second": timing.rates(length, times),
        "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
    }


def bench_attention(repeats: int, batch: int, dtype: str, warmup: int = 1) -> dict:
    """Forward + backward of one attention layer as the length grows: full, window, blocked.

    `batch` and `dtype` are ignored (batch 1, float32), so that every sub-benchmark takes the
    same arguments.
    """
    del batch, dtype
    out = {"bench": "attention", "radius": RADIUS, "heads": HEADS, "head_dim": HEAD_DIM}
    for name in VARIANTS:
        out[name] = [_length_row(name, length, repeats, warmup) for length in LENGTHS]
    return out
