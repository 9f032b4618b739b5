"""The weights of an attention layer: head sizes, q/k/v/out projections and score weights.

`Projections` creates the dense layers ("qkv", "query", "kv", "key", "value", "value_down",
"value_up", "out") and `score_weights` the parameters of the general and additive scores. Both
are called from `MultiHeadAttention`'s compact `__call__`, so everything they create lives
directly under that module's scope: the parameter names are the module's own.

Sources:
- multi-head projections W^Q, W^K, W^V [D, N, H] and W^O [N, H, D]: Vaswani et al. 2017, §3.2.2;
- multi-query and grouped-query attention (K < N kv heads): Shazeer 2019; Ainslie et al. 2023
  (GQA), §2;
- low-rank value projection: the value matrix factorised as W_down [D, r] · W_up [r, K·H];
- general score weight W [N, H, H]: Luong et al. 2015, §3.1; additive score weights W_q, W_k
  [N, H, A] and v [N, A]: Bahdanau et al. 2015, Appendix A.1.2 (here A = H).
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Float

from tfjax.nn import linear


def head_sizes(
    width: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[int, int, int]:
    """(N, K, H) from the attributes: K = 0 means N, H = 0 means D // N for model width D.

    Raises:
      ValueError: when N is not a positive multiple of K, or H = 0 and N does not divide D.
    """
    n = num_heads
    kv = num_kv_heads or n
    if n <= 0 or n % kv:
        raise ValueError(f"num_heads={n} must be a positive multiple of num_kv_heads={kv}")
    h = head_dim or width // n
    if not head_dim and width % n:
        raise ValueError(f"model width {width} is not divisible by num_heads={n}")
    return n, kv, h


@dataclasses.dataclass(frozen=True)
class Projections:
    """Builds an attention module's projections; call the methods inside its compact `__call__`.

    Parameters: "qkv" [D, N + 2K, H] (fused self-attention), or "query" [D, N, H] with "kv"
    [Dkv, 2K, H] (fused cross-attention) or "key"/"value" [Dkv, K, H] (unfused); "out"
    [N, H, D]. With `value_rank` r > 0 the value projection is "value_down" [Dkv, r] ·
    "value_up" [r, K, H] and the fused layers leave the value out.

    Attributes:
      fused_qkv: one projection for q, k and v (for k and v in cross-attention).
      value_rank: rank of a factorised value projection (0 = full rank).
      use_bias: biases in the projections ("value_down" has none).
      dtype: computation dtype; param_dtype: parameter dtype.
      kernel_init: initializer of the projection kernels.
    """

    fused_qkv: bool
    value_rank: int
    use_bias: bool
    dtype: Any
    param_dtype: Any
    kernel_init: nn.initializers.Initializer

    def _dense(self, features, name: str, axis=-1, use_bias=None) -> nn.DenseGeneral:
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

    def query(self, x_q: Float[Array, "B L D"], n: int, h: int) -> Float[Array, "B L N H"]:
        """Queries from the "query" projection (unfused, or cross-attention)."""
        return self._dense((n, h), "query")(x_q)  # [B, L, N, H]

    def key_value(self, x_kv: Array, kv: int, h: int) -> tuple[Array, Array]:
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

    def qkv(self, x_q: Array, x_kv: Array | None, n: int, kv: int, h: int):
        """Returns q [B, L, N, H], k [B, S, K, H], v [B, S, K, H]; x_kv None = self-attention."""
        if x_kv is None and self.fused_qkv:
            low_rank = self.value_rank > 0
            width = n + kv + (0 if low_rank else kv)
            qkv = self._dense((width, h), "qkv")(x_q)  # [B, L, N + 2K, H]
            q, k = qkv[:, :, :n], qkv[:, :, n : n + kv]
            v = self._low_rank_value(x_q, kv, h) if low_rank else qkv[:, :, n + kv :]
        else:
            q = self.query(x_q, n, h)  # [B, L, N, H]
            k, v = self.key_value(x_q if x_kv is None else x_kv, kv, h)
        return _by_heads(q, "heads"), _by_heads(k, "kv_heads"), _by_heads(v, "kv_heads")

    def output(self, x: Float[Array, "B L N H"], width: int) -> Float[Array, "B L D"]:
        """The "out" projection W^O back to the model width D."""
        x = _by_heads(x, "heads")
        return self._dense(width, "out", axis=(-2, -1))(x)  # [B, L, D]


def _by_heads(x: Array, heads: str) -> Array:
    """[B, L, N or K, H] pinned to the layout of its logical axes (tensor parallelism splits the
    heads); a no-op outside a `parallel.rules` context (`tfjax.parallel.layout`)."""
    return nn.with_logical_constraint(x, ("batch", "length", heads, "kv"))


def score_weights(
    module: nn.Module, score: str, n: int, h: int, param_dtype: Any
) -> dict[str, Array] | None:
    """`module`'s parameters of the general ("score_w") or additive ("score_w_q", "score_w_k",
    "score_v") score, as `core.attention_logits` takes them; None for the dot scores.

    The general score's W starts as the identity in every head, i.e. as the dot score.
    """
    if score == "general":
        eye = lambda key, shape, dtype: jnp.broadcast_to(jnp.eye(h, dtype=dtype), shape)  # noqa: E731
        return {"w": module.param("score_w", eye, (n, h, h), param_dtype)}
    if score == "additive":
        init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
        return {
            "w_q": module.param("score_w_q", init, (n, h, h), param_dtype),
            "w_k": module.param("score_w_k", init, (n, h, h), param_dtype),
            "v": module.param("score_v", nn.initializers.normal(h**-0.5), (n, h), param_dtype),
        }
    return None
