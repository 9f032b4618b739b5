"""The `attention` sub-benchmark: attention's forward + backward as the length grows.

Batch 1, 4 heads of 64, lengths 256 to 16,384, four variants of one attention layer: full
attention (the reference einsum path: `implementation="reference"`), the dense sliding-window
mask (radius 64, still O(L^2)), the blocked local attention of
`tfjax.nn.attention.local_attention` (O(L * r)) and `implementation="chunked"` (the online
softmax of `tfjax.nn.attention.chunked`, memory linear in L), each with XLA's temporary memory
of the compiled forward + backward. A variant whose temporaries would pass `MEMORY_BUDGET` is
compiled (its memory is reported) but not run. Then a whole model: a 2-layer encoder
(`encoder_only`, D = 256, T5 relative positions) with `window_radius=64` (the blocked path),
without a window, and with `attention_impl="chunked"`, lengths 512 to 4096. Not in the default
`--bench` list: about a quarter of an hour on a 2-core CPU.
"""

import statistics

import jax
import jax.numpy as jnp

from experiments.bench import timing
from tfjax import models
from tfjax.nn import attention, masking
from tfjax.nn.attention import chunked

LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
RADIUS = 64
HEADS = 4
HEAD_DIM = 64
VARIANTS = ("full", "window_mask", "local_blocked", "chunked")
ENCODER_LENGTHS = (512, 1024, 2048, 4096)
# name -> (window_radius, attention_impl)
ENCODER_VARIANTS = {
    "encoder_window": (RADIUS, "auto"),
    "encoder_dense": (0, "auto"),
    "encoder_chunked": (0, "chunked"),
}
MEMORY_BUDGET = 6 * 2**30  # bytes of XLA temporaries above which a variant is not run
SLOW_CALL = 10.0  # seconds: a variant whose warm-up call took longer is timed once


def _attention_variant(name: str, length: int):
    """(jitted fwd+bwd function, q, k, v) of one attention layer on [1, L, 4, 64]."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, length, HEADS, HEAD_DIM)) for i in range(3))
    if name == "local_blocked":
        fn = lambda q, k, v: attention.local_attention(q, k, v, radius=RADIUS)  # noqa: E731
    elif name == "chunked":
        fn = lambda q, k, v: attention.dot_product_attention(  # noqa: E731
            q, k, v, implementation="chunked"
        )
    else:
        mask = masking.window_mask(length, RADIUS) if name == "window_mask" else None
        fn = lambda q, k, v: attention.dot_product_attention(  # noqa: E731
            q, k, v, mask=mask, implementation="reference"
        )
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) ** 2), argnums=(0, 1, 2)))
    return grad, q, k, v


def _encoder_variant(radius: int, attention_impl: str, length: int):
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
        attention_impl=attention_impl,
    )
    model = models.create_model(cfg)
    tokens = jax.random.randint(jax.random.key(0), (1, length), 3, cfg.vocab_size)
    params = model.init(jax.random.key(1), tokens)["params"]
    loss = lambda p, t: jnp.sum(model.apply({"params": p}, t) ** 2)  # noqa: E731
    return jax.jit(jax.grad(loss)), params, tokens


def _length_row(name: str, length: int, repeats: int, warmup: int) -> dict:
    """Seconds, tokens/s and XLA temp bytes of variant `name` at one length; not run (times
    None) when its temporaries pass `MEMORY_BUDGET`, timed once when a call is slow."""
    if name in ENCODER_VARIANTS:
        grad, *args = _encoder_variant(*ENCODER_VARIANTS[name], length)
    else:
        grad, *args = _attention_variant(name, length)
    memory = grad.lower(*args).compile().memory_analysis()
    temp_bytes = getattr(memory, "temp_size_in_bytes", None)
    row = {"length": length, "temp_bytes": temp_bytes}
    if temp_bytes is not None and temp_bytes > MEMORY_BUDGET:
        return {**row, "seconds_median": None, "tokens_per_second": None, "skipped": "memory"}
    first = timing.warm_up(lambda: grad(*args), warmup)
    times = [
        timing.time_once(lambda: grad(*args)) for _ in range(repeats if first < SLOW_CALL else 1)
    ]
    return {
        **row,
        "seconds_median": statistics.median(times),
        "tokens_per_second": timing.rates(length, times),
    }


def bench_attention(repeats: int, batch: int, dtype: str, warmup: int = 1) -> dict:
    """Forward + backward as the length grows: one attention layer (full, window mask, blocked
    local, chunked), and a 2-layer encoder with and without `window_radius`, and chunked.

    `batch` and `dtype` are ignored (batch 1, float32), so that every sub-benchmark takes the
    same arguments.
    """
    del batch, dtype
    out = {
        "bench": "attention",
        "radius": RADIUS,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "chunks": [chunked.QUERY_CHUNK, chunked.KEY_CHUNK],
        "memory_budget_bytes": MEMORY_BUDGET,
    }
    for name in VARIANTS:
        out[name] = [_length_row(name, length, repeats, warmup) for length in LENGTHS]
    for name in ENCODER_VARIANTS:
        out[name] = [_length_row(name, length, repeats, warmup) for length in ENCODER_LENGTHS]
    return out
