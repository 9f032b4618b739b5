"""Norms over the last axis: LayerNorm and RMSNorm, as functions and as Flax modules.

Sources:
- LayerNorm, gamma * (x - mean) / sqrt(var + eps) + beta: Ba et al. 2016, §3;
- RMSNorm, gamma * x / sqrt(mean(x^2) + eps): Zhang & Sennrich 2019, §4.

Statistics are computed in float32 and cast back to the compute dtype.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

NORMS = ("layernorm", "rmsnorm")


def layer_norm(
    x: Float[Array, "*B D"],
    scale: Float[Array, " D"],
    bias: Float[Array, " D"] | None,
    eps: float = 1e-6,
) -> Float[Array, "*B D"]:
    """gamma * (x - mean) / sqrt(var + eps) + beta over the last axis, statistics in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def rms_norm(
    x: Float[Array, "*B D"], scale: Float[Array, " D"], eps: float = 1e-6
) -> Float[Array, "*B D"]:
    """gamma * x / sqrt(mean(x^2) + eps) over the last axis, statistics in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with parameters "scale" [D] (ones) and "bias" [D] (zeros)."""

    epsilon: float = 1e-6
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,), self.param_dtype)
        bias = (
            self.param("bias", nn.initializers.zeros, (d,), self.param_dtype)
            if (self.use_bias)
            else None
        )
        return layer_norm(x.astype(self.dtype), scale, bias, self.epsilon)


class RMSNorm(nn.Module):
    """RMSNorm with a parameter "scale" [D] (ones)."""

    epsilon: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        return rms_norm(x.astype(self.dtype), scale, self.epsilon)


def make_norm(kind: str, *, epsilon: float, dtype, param_dtype, name: str | None = None):
    """Builds the norm called `kind` (one of `NORMS`)."""
    if kind == "layernorm":
        return LayerNorm(epsilon, dtype=dtype, param_dtype=param_dtype, name=name)
    if kind == "rmsnorm":
        return RMSNorm(epsilon, dtype=dtype, param_dtype=param_dtype, name=name)
    raise ValueError(f"norm={kind!r} is not one of {NORMS}")
