"""The `decode` sub-benchmark: generated tokens/s of three decoders on the benchmark model.

Each variant generates `target_len` tokens per source with EOS disabled, so that every variant
does the same work: KV-cached greedy (`decoding.generate`), uncached greedy recomputing the
prefix at every step (`decoding.greedy_decode`) and beam search with 4 beams
(`beam_search.beam_search`). `cached_speedup` is cached over uncached greedy tokens/s. With
`peer="flax"`, the stock-Flax peer's cached greedy decoding and beam search (4 beams, its
`decode=True` cache reordered each step) are timed in alternating pairs with tfjax's.
"""

import functools
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from experiments.bench import flax_peer, timing, workload
from tfjax.inference import beam_search, decoding

NO_EOS = -1  # never produced: every variant generates exactly `target_len` tokens
BEAM_SIZE = 4


def _variants(
    model: nn.Module, src: jax.Array, seg: jax.Array, length: int, cache_start: int = 0
) -> dict[str, Callable]:
    """name -> jitted `fn(params)` decoding the sources `src` [B, S] (segment ids `seg` [B, S],
    int32) to `length` tokens each; the cached decoders take `cache_start`."""
    return {
        "greedy_cached": jax.jit(
            lambda p: decoding.generate(
                model,
                p,
                inputs=src,
                inputs_segment_ids=seg,
                max_length=length,
                eos_id=NO_EOS,
                cache_start=cache_start,
            )
        ),
        "greedy_uncached": jax.jit(
            lambda p: decoding.greedy_decode(
                model, p, src, inputs_segment_ids=seg, max_length=length, eos_id=NO_EOS
            )
        ),
        "beam4": jax.jit(
            lambda p: beam_search.beam_search(
                model,
                p,
                src,
                inputs_segment_ids=seg,
                beam_size=BEAM_SIZE,
                max_length=length,
                eos_id=NO_EOS,
                cache_start=cache_start,
            )
        ),
    }


def bench_decode(
    repeats: int,
    batch: int,
    dtype: str,
    shape: dict = workload.SHAPE,
    warmup: int = 1,
    peer: str = "",
    cache_start: int = 0,
) -> dict:
    """Generated tokens/s and compile time of each decoder (see the module docstring);
    `cache_start` as in `decoding.generate` (0: one cache of target_len slots)."""
    model = workload.create_model(dtype, shape)
    data = workload.random_batch(batch, shape)
    params = jax.jit(model.init)(jax.random.key(0), data["inputs"], data["targets"])["params"]
    length = shape["target_len"]
    src, seg = jnp.asarray(data["inputs"]), jnp.asarray(data["inputs_segment_ids"])
    variants = _variants(model, src, seg, length, cache_start)
    out = {"bench": "decode", "generated_tokens": batch * length, "cache_start": cache_start}
    for name, fn in variants.items():
        first, times = timing.time_calls(lambda fn=fn: fn(params), repeats, warmup)
        out[name] = {
            "generated_tokens_per_second": timing.rates(batch * length, times),
            "compile_seconds": first - statistics.median(times),
        }
    cached = out["greedy_cached"]["generated_tokens_per_second"]["median"]
    uncached = out["greedy_uncached"]["generated_tokens_per_second"]["median"]
    out["cached_speedup"] = cached / uncached
    if peer == "flax":
        out["peer"] = _flax_peer(variants, params, data, shape, dtype, repeats)
    return out


def _flax_peer(ours: dict, params, data: dict, shape: dict, dtype: str, repeats: int) -> dict:
    """Cached greedy decoding and beam search (`BEAM_SIZE` beams) of the stock-Flax peer (its
    own `decode=True` cache; `flax_peer.make_greedy_decoder`, `make_beam_decoder`), each timed
    in alternating pairs with tfjax's `greedy_cached` / `beam4` on the same sources and length.
    """
    peer_model = flax_peer.build_model(shape, dtype)
    peer_params = flax_peer.init_params(peer_model, data)
    src, seg = data["inputs"], data["inputs_segment_ids"]
    decoders = {
        "greedy_cached": flax_peer.make_greedy_decoder(shape, peer_params, dtype=dtype),
        "beam4": flax_peer.make_beam_decoder(shape, peer_params, BEAM_SIZE, dtype=dtype),
    }
    tokens = src.shape[0] * shape["target_len"]
    out: dict = {"name": flax_peer.PEER}
    for name, decode in decoders.items():
        peer_fn = functools.partial(decode, peer_params, src, seg)
        peer_first = timing.time_once(peer_fn)
        _, times, peer_times = timing.time_pairs(lambda n=name: ours[n](params), peer_fn, repeats)
        ratios = [peer_t / t for t, peer_t in zip(times, peer_times, strict=True)]
        out[name] = {
            "generated_tokens_per_second": timing.rates(tokens, peer_times),
            "compile_seconds": peer_first - statistics.median(peer_times),
        }
        out[f"{name}_ratio_per_pair"] = ratios
        out[f"{name}_ratio_median"] = statistics.median(ratios)
    return out
