"""Attention: score functions, the masked softmax and the multi-head attention module.

Sources:
- scaled dot-product and multi-head attention: Vaswani et al. 2017, "Attention Is All You Need",
  §3.2.1 (Eq. 1) and §3.2.2; self- and cross-attention (encoder-decoder attention): §3.2.3;
- plain dot and general (bilinear, q^T W k) scores: Luong et al. 2015, §3.1;
- additive scores, v^T tanh(W_q q + W_k k): Bahdanau et al. 2015, Appendix A.1.2;
- multi-query and grouped-query attention: Shazeer 2019; Ainslie et al. 2023 (GQA), §2;
- low-rank value projection: the value matrix factorised as W_down [D, r] · W_up [r, K·H];
- key/value cache for autoregressive decoding (flax "cache" collection): self-attention keys and
  values are written one step at a time, encoder keys/values are projected once per source.

Axis letters: B batch, L query length, S key length, D model width, N query heads, K key/value
heads, G = N // K queries per kv head, H head width, A additive-score width.
Masks are boolean (True = may attend) and broadcast to [B, N, L, S]; they are applied once, here,
with float32 logits and a finite large negative; fully masked query rows return zeros.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from tfjax.nn import linear, positional

SCORES = ("scaled_dot", "dot", "general", "additive")
IMPLEMENTATIONS = ("auto", "reference", "xla", "cudnn")
_FAST_SCORES = ("scaled_dot", "dot")


def _check_score(score: str) -> None:
    if score not in SCORES:
        raise ValueError(f"score={score!r} is not one of {SCORES}")


def _check_qkv(q: Array, k: Array, v: Array) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [B, L, N, H], [B, S, K, H], [B, S, K, H]; got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if k.shape != v.shape[:3] + k.shape[3:] or q.shape[0] != k.shape[0]:
        raise ValueError(f"k {k.shape} and v {v.shape} must share [B, S, K]; q is {q.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(
            f"query heads N={q.shape[2]} must be a multiple of kv heads K={k.shape[2]}"
        )


def _grouped(q: Float[Array, "B L N H"], num_kv_heads: int) -> Float[Array, "B L K G H"]:
    b, length, n, h = q.shape
    return q.reshape(b, length, num_kv_heads, n // num_kv_heads, h)  # [B, L, K, G, H]


def attention_logits(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    *,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
) -> Float[Array, "B N L S"]:
    """Unnormalised attention scores in float32.

    Args:
      q: queries [B, L, N, H].
      k: keys [B, S, K, H]; K divides N (query head n uses kv head n // G).
      score: "scaled_dot" (q·k / sqrt(H), Vaswani §3.2.1), "dot" (q·k, Luong §3.1), "general"
        (q^T W k, Luong §3.1; needs `score_params["w"]` [N, H, H]) or "additive"
        (v^T tanh(W_q q + W_k k), Bahdanau A.1.2; needs "w_q" [N, H, A], "w_k" [N, H, A],
        "v" [N, A]). The additive score materialises [B, N, L, S, A]: use it on small inputs.
      score_params: parameters of the general and additive scores.

    Returns:
      float32 logits [B, N, L, S].
    """
    _check_score(score)
    b, length, n, h = q.shape
    num_kv = k.shape[2]
    if score == "additive":
        k_full = jnp.repeat(k, n // num_kv, axis=2)  # [B, S, N, H]
        q_a = jnp.einsum("BLNH,NHA->BNLA", q, score_params["w_q"])
        k_a = jnp.einsum("BSNH,NHA->BNSA", k_full, score_params["w_k"])
        hidden = jnp.tanh(q_a[:, :, :, None, :] + k_a[:, :, None, :, :])  # [B, N, L, S, A]
        return jnp.einsum("BNLSA,NA->BNLS", hidden, score_params["v"]).astype(jnp.float32)
    if score == "general":
        q = jnp.einsum("BLNH,NHI->BLNI", q, score_params["w"])  # [B, L, N, H]
    logits = jnp.einsum("BLKGH,BSKH->BKGLS", _grouped(q, num_kv), k)
    logits = logits.reshape(b, n, length, k.shape[1]).astype(jnp.float32)  # [B, N, L, S]
    if score == "scaled_dot":
        logits = logits * h**-0.5
    return logits


def masked_softmax(
    logits: Float[Array, "B N L S"], mask: Bool[Array, "#B #N #L #S"] | None = None
) -> Float[Array, "B N L S"]:
    """Softmax over keys in float32 with boolean masking; fully masked rows are all zeros."""
    logits = logits.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0)


def _row_has_key(mask: Array, out_shape: tuple[int, ...]) -> Array:
    """[B, L, N|1, 1] bool: whether each query row may attend to at least one key."""
    row = jnp.any(mask, axis=-1)  # [B|1, N|1, L|1]
    row = jnp.broadcast_to(row, (row.shape[0], row.shape[1], out_shape[1]))
    return jnp.swapaxes(row, 1, 2)[..., None]  # [B|1, L, N|1, 1]


def _use_fast_path(score: str, implementation: str, dropout: bool) -> bool:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")
    fast = implementation != "reference" and score in _FAST_SCORES and not dropout
    if implementation == "cudnn" and not fast:
        raise ValueError(
            f"implementation='cudnn' runs the dot scores without probability dropout; got "
            f"score={score!r}{' with dropout' if dropout else ''}: use implementation='auto'"
        )
    return fast


def _check_cudnn(q: Array) -> None:
    """cuDNN's fused attention: an NVIDIA GPU and 16-bit inputs, else a clear error."""
    if jax.default_backend() != "gpu":
        raise ValueError(
            f"implementation='cudnn' needs an NVIDIA GPU (JAX's default backend is "
            f"{jax.default_backend()!r}): use implementation='auto'"
        )
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"implementation='cudnn' takes bfloat16 or float16 inputs, got {q.dtype}: set the "
            f"compute dtype (ModelConfig.dtype) to bfloat16, or use implementation='auto'"
        )


def dot_product_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    score: str = "scaled_dot",
    score_params: dict[str, Array] | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
    implementation: str = "auto",
) -> Float[Array, "B L N H"]:
    """Attention of queries over keys and values (Vaswani et al. 2017, Eq. 1).

    Args:
      q: queries [B, L, N, H] in the compute dtype.
      k, v: keys and values [B, S, K, H]; K divides N (multi-query K = 1, grouped-query 1 < K < N).
      mask: bool, True = may attend, broadcastable to [B, N, L, S].
      bias: float additive logit bias broadcastable to [B, N, L, S] (relative positions, ALiBi).
      score: one of `SCORES`; see `attention_logits`.
      score_params: parameters of the "general" and "additive" scores.
      dropout_rate: dropout on the attention probabilities (active when not deterministic).
      dropout_rng: PRNG key for that dropout.
      deterministic: disables dropout.
      implementation: "auto" uses `jax.nn.dot_product_attention`'s XLA path for the dot scores
        without probability dropout, else the reference path; "xla" is "auto" by another name;
        "cudnn" asks `jax.nn.dot_product_attention` for cuDNN's fused (flash) attention, which
        needs an NVIDIA GPU, bf16/fp16 inputs, a dot score and no probability dropout (a
        ValueError says which is missing); "reference" always uses the einsum path written here.

    Returns:
      [B, L, N, H] in the dtype of `v`; rows whose mask is all False are zeros.
    """
    _check_qkv(q, k, v)
    dropout = dropout_rate > 0.0 and not deterministic
    if _use_fast_path(score, implementation, dropout):
        if implementation == "cudnn":
            _check_cudnn(q)
        out = jax.nn.dot_product_attention(
            q,
            k.astype(q.dtype),
            v.astype(q.dtype),
            bias=None if bias is None else bias.astype(q.dtype),
            mask=mask,
            scale=q.shape[-1] ** -0.5 if score == "scaled_dot" else 1.0,
            implementation="cudnn" if implementation == "cudnn" else None,
        ).astype(v.dtype)
        if mask is not None:
            out = jnp.where(_row_has_key(mask, out.shape), out, 0).astype(v.dtype)
        return out
    logits = attention_logits(q, k, score=score, score_params=score_params)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    probs = masked_softmax(logits, mask)  # [B, N, L, S] float32
    if dropout:
        if dropout_rng is None:
            raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    b, n, length, s = probs.shape
    num_kv = k.shape[2]
    probs = probs.reshape(b, num_kv, n // num_kv, length, s).astype(v.dtype)  # [B, K, G, L, S]
    out = jnp.einsum("BKGLS,BSKH->BLKGH", probs, v)
    return out.reshape(b, length, n, v.shape[-1])  # [B, L, N, H]


def cached_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B K S H"],
    v: Float[Array, "B K S H"],
    *,
    mask: Bool[Array, "#B #N #L #S"] | None = None,
    bias: Float[Array, "#B #N #L #S"] | None = None,
    scale: float = 1.0,
) -> Float[Array, "B L N H"]:
    """Dot-product attention over a head-major key/value cache, as decoding keeps it.

    The same result as `dot_product_attention` with k and v transposed to [B, S, K, H], but
    both contractions read the cache where it lies: batch and kv-head axes lead, so XLA needs
    no copy of the cache at every step (on CPU, transposing the caches of beam search took
    44% of its op time). `scale` multiplies the logits (H^-0.5 for the scaled score).
    """
    b, length, n, h = q.shape
    num_kv, s = k.shape[1], k.shape[2]
    qg = q.reshape(b, length, num_kv, n // num_kv, h)  # [B, L, K, G, H]
    logits = jnp.einsum("BLKGH,BKSH->BKGLS", qg, k.astype(q.dtype))
    logits = logits.reshape(b, n, length, s).astype(jnp.float32) * scale  # [B, N, L, S]
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    probs = masked_softmax(logits, mask)  # [B, N, L, S] float32
    probs = probs.reshape(b, num_kv, n // num_kv, length, s).astype(v.dtype)  # [B, K, G, L, S]
    out = jnp.einsum("BKGLS,BKSH->BLKGH", probs, v)
    return out.reshape(b, length, n, v.shape[-1])  # [B, L, N, H]


def _head_major(x: Float[Array, "B S K H"]) -> Float[Array, "B K S H"]:
    return jnp.swapaxes(x, 1, 2)


def _seq_major(x: Float[Array, "B K S H"]) -> Float[Array, "B S K H"]:
    return jnp.swapaxes(x, 1, 2)


def _seq_major_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[1], shape[3])


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2) with grouped-query heads.

    Self-attention when `inputs_kv` is None (one fused QKV projection by default); otherwise
    cross-attention with queries from `inputs_q` (the decoder) and keys and values from
    `inputs_kv` (the encoder output), §3.2.3.

    Decoding (`decode=True`) keeps a "cache" collection: self-attention holds "cached_key",
    "cached_value" [B, K, max_len, H] and "cache_index" (int32 scalar); cross-attention holds
    "cached_cross_key", "cached_cross_value" [B, K, S, H]. The cache is head-major so that
    `cached_attention` reads it in place at every step.

    Parameters: "qkv" [D, N + 2K, H] (fused self-attention), or "query" [D, N, H] with "kv"
    [Dkv, 2K, H] (cross-attention) or "key"/"value" [Dkv, K, H] (unfused); "out" [N, H, D].
    With `value_rank` r > 0 the value projection is "value_down" [Dkv, r] · "value_up" [r, K, H].

    Attributes:
      num_heads: N.
      num_kv_heads: K (0 = N; 1 = multi-query).
      head_dim: H (0 = D // N).
      score: one of `SCORES`.
      dropout_rate: attention-probability dropout.
      fused_qkv: one [D, N + 2K, H] projection for self-attention (one matmul instead of three).
      value_rank: rank of a factorised value projection (0 = full rank).
      rotary: apply rotary position embeddings (RoPE) to queries and keys.
      rope_base: RoPE frequency base.
      use_bias: biases in the projections (the paper's and PyTorch's layers have them).
      implementation: see `dot_product_attention`.
      cross: this is a cross-attention layer; while decoding it may be called without
        `inputs_kv` and then reads the encoder keys/values from the cache.
      dtype: computation dtype; param_dtype: parameter dtype.
    """

    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 0
    score: str = "scaled_dot"
    dropout_rate: float = 0.0
    fused_qkv: bool = True
    value_rank: int = 0
    rotary: bool = False
    rope_base: float = 10000.0
    use_bias: bool = True
    implementation: str = "auto"
    cross: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.xavier_uniform()

    def _sizes(self, width: int) -> tuple[int, int, int]:
        n = self.num_heads
        kv = self.num_kv_heads or n
        if n <= 0 or n % kv:
            raise ValueError(f"num_heads={n} must be a positive multiple of num_kv_heads={kv}")
        h = self.head_dim or width // n
        if not self.head_dim and width % n:
            raise ValueError(f"model width {width} is not divisible by num_heads={n}")
        return n, kv, h

    def _dense(self, features, name: str, axis=-1, use_bias=None):
        return nn.DenseGeneral(
            features,
            axis=axis,
            use_bias=self.use_bias if use_bias is None else use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            dot_general=linear.dense_dot_general,
            name=name,
        )

    def _project_kv(self, x_kv: Array, kv: int, h: int) -> tuple[Array, Array]:
        """Returns k, v [B, S, K, H] from the separate "kv" (or "key"/"value") projections."""
        low_rank = self.value_rank > 0
        if self.fused_qkv and not low_rank:
            kv_proj = self._dense((2 * kv, h), "kv")(x_kv)  # [B, S, 2K, H]
            return kv_proj[:, :, :kv], kv_proj[:, :, kv:]
        k = self._dense((kv, h), "key")(x_kv)  # [B, S, K, H]
        if low_rank:
            return k, self._low_rank_value(x_kv, kv, h)
        return k, self._dense((kv, h), "value")(x_kv)  # [B, S, K, H]

    def _low_rank_value(self, x_kv: Array, kv: int, h: int) -> Array:
        v = self._dense(self.value_rank, "value_down", use_bias=False)(x_kv)  # [B, S, r]
        return self._dense((kv, h), "value_up")(v)  # [B, S, K, H]

    def _project(self, x_q: Array, x_kv: Array | None, n: int, kv: int, h: int):
        """Returns q [B, L, N, H], k [B, S, K, H], v [B, S, K, H]."""
        if x_kv is None and self.fused_qkv:
            low_rank = self.value_rank > 0
            width = n + kv + (0 if low_rank else kv)
            qkv = self._dense((width, h), "qkv")(x_q)  # [B, L, N + 2K, H]
            q, k = qkv[:, :, :n], qkv[:, :, n : n + kv]
            v = self._low_rank_value(x_q, kv, h) if low_rank else qkv[:, :, n + kv :]
            return q, k, v
        q = self._dense((n, h), "query")(x_q)  # [B, L, N, H]
        k, v = self._project_kv(x_q if x_kv is None else x_kv, kv, h)
        return q, k, v

    def _self_cache(self, k: Array, v: Array) -> tuple[Array, Array]:
        """Writes the new keys/values [B, L, K, H] at `cache_index`; returns the whole cache,
        head-major [B, K, max_len, H].

        When the cache does not exist yet (`model.init` with decode=True on full-length inputs),
        it is created with zeros of the inputs' shape, head-major, and k, v pass through.
        """
        k, v = _head_major(k), _head_major(v)  # [B, K, L, H]
        exists = self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        if not exists:
            return k, v
        b, num_kv, max_len, h = cached_k.value.shape
        if k.shape[:2] != (b, num_kv) or k.shape[3] != h or k.shape[2] > max_len:
            raise ValueError(
                f"new keys {_seq_major_shape(k.shape)} [B, L, K, H] do not fit the cache "
                f"[B, K, max_len, H] = {cached_k.value.shape}"
            )
        start = (0, 0, index.value, 0)
        update = jax.lax.dynamic_update_slice
        cached_k.value = update(cached_k.value, k.astype(cached_k.value.dtype), start)
        cached_v.value = update(cached_v.value, v.astype(cached_v.value.dtype), start)
        index.value = index.value + k.shape[2]
        return cached_k.value, cached_v.value

    def _cross_cache(self, inputs_kv: Array | None, kv: int, h: int) -> tuple[Array, Array]:
        """Encoder keys/values, head-major [B, K, S, H], projected once per source and kept in
        the cache."""
        if inputs_kv is not None:
            k, v = map(_head_major, self._project_kv(inputs_kv, kv, h))  # [B, K, S, H]
            self.put_variable("cache", "cached_cross_key", k)
            self.put_variable("cache", "cached_cross_value", v)
            return k, v
        if not self.has_variable("cache", "cached_cross_key"):
            raise ValueError(
                "cross-attention with decode=True and inputs_kv=None reads the cached encoder "
                "keys, but the cache has none: pass the encoder output once first"
            )
        return (
            self.get_variable("cache", "cached_cross_key"),
            self.get_variable("cache", "cached_cross_value"),
        )

    def _attend(self, q, k, v, mask, bias, n: int, h: int, deterministic: bool) -> Array:
        """`dot_product_attention` with this module's settings; k, v [B, S, K, H]."""
        dropout = self.dropout_rate > 0.0 and not deterministic
        return dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            score=self.score,
            score_params=self._score_params(n, h),
            dropout_rate=self.dropout_rate,
            dropout_rng=self.make_rng("dropout") if dropout else None,
            deterministic=deterministic,
            implementation=self.implementation,
        )  # [B, L, N, H]

    def _attend_cache(self, q, k, v, mask, bias, n: int, h: int, deterministic: bool) -> Array:
        """Attention over the head-major cached k, v [B, K, S, H]; returns [B, L, N, H]."""
        dropout = self.dropout_rate > 0.0 and not deterministic
        if _use_fast_path(self.score, self.implementation, dropout):
            scale = h**-0.5 if self.score == "scaled_dot" else 1.0
            return cached_attention(q, k, v, mask=mask, bias=bias, scale=scale)
        return self._attend(q, _seq_major(k), _seq_major(v), mask, bias, n, h, deterministic)

    def _decode_positions(self, q: Array) -> Array:
        """Default RoPE positions while decoding: cache_index, cache_index + 1, ... [B, L]."""
        start = 0
        if self.has_variable("cache", "cached_key"):
            start = self.get_variable("cache", "cache_index")
        return positional.default_positions(q) + start

    def _score_params(self, n: int, h: int) -> dict[str, Array] | None:
        if self.score == "general":
            eye = lambda key, shape, dtype: jnp.broadcast_to(jnp.eye(h, dtype=dtype), shape)  # noqa: E731
            return {"w": self.param("score_w", eye, (n, h, h), self.param_dtype)}
        if self.score == "additive":
            init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
            return {
                "w_q": self.param("score_w_q", init, (n, h, h), self.param_dtype),
                "w_k": self.param("score_w_k", init, (n, h, h), self.param_dtype),
                "v": self.param(
                    "score_v", nn.initializers.normal(h**-0.5), (n, h), self.param_dtype
                ),
            }
        return None

    @nn.compact
    def __call__(
        self,
        inputs_q: Float[Array, "B L D"],
        inputs_kv: Float[Array, "B S E"] | None = None,
        *,
        mask: Bool[Array, "#B #N #L #S"] | None = None,
        bias: Float[Array, "#B #N #L #S"] | None = None,
        q_positions: Array | None = None,
        kv_positions: Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
    ) -> Float[Array, "B L D"]:
        """Attends `inputs_q` over `inputs_kv` (self-attention when it is None).

        Args:
          inputs_q: [B, L, D] queries' inputs.
          inputs_kv: [B, S, E] keys' and values' inputs (cross-attention), or None.
          mask: bool, True = may attend, broadcastable to [B, N, L, S]. While decoding with
            self-attention S is the cache length and the mask must hide the unwritten slots.
          bias: additive logit bias broadcastable to [B, N, L, S] (relative positions, ALiBi).
          q_positions, kv_positions: int32 [B, L] / [B, S] positions for RoPE (default
            0..L-1, or cache_index.. while decoding; for packed rows pass per-segment positions).
          deterministic: disables attention dropout.
          decode: use the "cache" collection. Self-attention writes the L new keys/values at
            `cache_index` (created as zeros the first time, at full length) and attends over
            the whole cache [B, K, max_len, H]. Cross-attention (`cross=True`) projects
            `inputs_kv` once into the cache, or reads it back when `inputs_kv` is None.

        Returns:
          [B, L, D] in the compute dtype.

        Raises:
          ValueError: for a cross-attention module called without `inputs_kv` outside decoding,
            or a decoding step whose shapes do not fit the cache.
        """
        _check_score(self.score)
        width = inputs_q.shape[-1]
        n, kv, h = self._sizes(width)
        if self.cross and inputs_kv is None and not decode:
            raise ValueError("cross-attention needs inputs_kv unless decode=True")
        if self.cross and decode:
            q = self._dense((n, h), "query")(inputs_q)  # [B, L, N, H]
            k, v = self._cross_cache(inputs_kv, kv, h)
        else:
            q, k, v = self._project(inputs_q, inputs_kv, n, kv, h)
        if self.rotary:
            if q_positions is None:
                q_positions = (
                    self._decode_positions(q) if decode else positional.default_positions(q)
                )
            if kv_positions is None:
                kv_positions = q_positions if inputs_kv is None else positional.default_positions(k)
            q = positional.apply_rope(q, q_positions, base=self.rope_base)
            k = positional.apply_rope(k, kv_positions, base=self.rope_base)
        if decode and not self.cross:
            k, v = self._self_cache(k, v)  # [B, K, max_len, H]
        if decode:  # k, v: head-major [B, K, S, H]
            out = self._attend_cache(q, k, v, mask, bias, n, h, deterministic)
        else:
            out = self._attend(q, k, v, mask, bias, n, h, deterministic)  # [B, L, N, H]
        return self._dense(width, "out", axis=(-2, -1))(out)  # [B, L, D]


def _blocks(x: Array, block: int, num_blocks: int) -> Array:
    """[B, T, M, H] -> [B, num_blocks, block, M, H], zero-padded at the end."""
    pad = num_blocks * block - x.shape[1]
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return x.reshape(x.shape[0], num_blocks, block, *x.shape[2:])


def _neighbour_blocks(x: Array) -> Array:
    """[B, nb, W, M, H] -> [B, nb, 3W, M, H]: each block with its left and right neighbours."""
    zeros = jnp.zeros_like(x[:, :1])
    left = jnp.concatenate([zeros, x[:, :-1]], axis=1)
    right = jnp.concatenate([x[:, 1:], zeros], axis=1)
    return jnp.concatenate([left, x, right], axis=2)


def local_attention(
    q: Float[Array, "B L N H"],
    k: Float[Array, "B L K H"],
    v: Float[Array, "B L K H"],
    *,
    radius: int,
    causal: bool = False,
) -> Float[Array, "B L N H"]:
    """Self-attention restricted to |i - j| <= radius in O(L * radius) time and memory.

    The "restricted self-attention" of Vaswani et al. 2017 (§4, Table 1): queries are cut into
    blocks of `radius` positions; a query block attends only to its own and its two neighbouring
    key blocks (3 * radius keys), which hold every key within the radius. Equals
    `dot_product_attention` with `masking.window_mask(L, radius, causal=causal)`, whose dense
    [L, L] logits cost O(L^2).

    Args:
      q: queries [B, L, N, H]; k, v: keys and values [B, L, K, H], K divides N.
      radius: r >= 1; query i sees keys j with |i - j| <= r (i - r <= j <= i when causal).
      causal: also hide keys after the query.

    Returns:
      [B, L, N, H] in the dtype of `v`.
    """
    _check_qkv(q, k, v)
    if radius < 1:
        raise ValueError(f"radius must be >= 1, got {radius}")
    b, length, n, h = q.shape
    num_kv, nb = k.shape[2], -(-length // radius)
    qb = _blocks(q, radius, nb).reshape(b, nb, radius, num_kv, n // num_kv, h)
    kb = _neighbour_blocks(_blocks(k, radius, nb))  # [B, nb, 3W, K, H]
    vb = _neighbour_blocks(_blocks(v, radius, nb))
    logits = jnp.einsum("BCWKGH,BCSKH->BKGCWS", qb, kb).astype(jnp.float32) * h**-0.5
    q_pos = jnp.arange(nb)[:, None] * radius + jnp.arange(radius)[None]  # [nb, W]
    k_pos = jnp.arange(nb)[:, None] * radius + jnp.arange(-radius, 2 * radius)[None]  # [nb, 3W]
    offset = q_pos[:, :, None] - k_pos[:, None, :]  # [nb, W, 3W]
    mask = (jnp.abs(offset) <= radius) & (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] < length)
    if causal:
        mask = mask & (offset >= 0)
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jnp.where(mask, jax.nn.softmax(logits, axis=-1), 0.0).astype(v.dtype)
    out = jnp.einsum("BKGCWS,BCSKH->BCWKGH", probs, vb)
    return out.reshape(b, nb * radius, n, v.shape[-1])[:, :length]  # [B, L, N, H]
