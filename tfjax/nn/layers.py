"""Layers: feed-forward blocks, token embeddings with tied logits, residual sub-layers.

Sources:
- position-wise feed-forward max(0, x W1 + b1) W2 + b2: Vaswani et al. 2017, §3.3 (Eq. 2);
  GELU: Hendrycks & Gimpel 2016 (exact, or its tanh approximation, §2, as GPT-2 and T5 v1.1
  use it); SiLU / Swish: Ramachandran et al. 2017 (Marian's "swish"); gated variants
  SwiGLU (Swish(x W) * (x V)) W2 and GEGLU: Shazeer 2020, §2 (T5 v1.1 gates with tanh-GELU);
- embeddings scaled by sqrt(d_model) and shared with the pre-softmax projection: Vaswani §3.4
  (after Press & Wolf 2017);
- residual sub-layer LayerNorm(x + Dropout(Sublayer(x))) (post-LN): Vaswani §3.1 and §5.4;
  pre-LN x + Dropout(Sublayer(LayerNorm(x))): Xiong et al. 2020, §3.

The norms live in `tfjax.nn.norms`.
"""

import numbers
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from tfjax.nn import linear, norms, prng

NORM_POSITIONS = ("post", "pre")
RESIDUAL_IMPLS = ("xla", "pallas")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu_tanh")
GATED_ACTIVATIONS = ("swiglu", "geglu_tanh")


class FeedForward(nn.Module):
    """Position-wise feed-forward block [B, L, D] -> [B, L, D].

    Parameters "wi" [D, F] and "wo" [F, D] (with biases when `use_bias`); the gated
    activations (`GATED_ACTIVATIONS`) add "wi_gate" [D, F] and, following Shazeer 2020, are
    usually run without biases.

    Attributes:
      mlp_dim: F, the hidden width (2048 in the paper's base model).
      activation: "relu" (paper), "gelu" (exact), "gelu_tanh" (tanh approximation), "silu",
        or gated: "swiglu" (silu(x W_gate) * (x W)), "geglu_tanh" (gelu_tanh(x W_gate) * (x W)).
      dropout_rate: dropout on the hidden activations (0 in the paper).
    """

    mlp_dim: int
    activation: str = "relu"
    dropout_rate: float | jax.Array = 0.0  # an Array: traced (vectorised sweeps)
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.xavier_uniform()

    def _dense(self, features: int, name: str) -> nn.Dense:
        return nn.Dense(
            features,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            dot_general=linear.dense_dot_general,
            name=name,
        )

    @nn.compact
    def __call__(
        self, x: Float[Array, "B L D"], *, deterministic: bool = True
    ) -> Float[Array, "B L D"]:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} is not one of {ACTIVATIONS}")
        hidden = self._dense(self.mlp_dim, "wi")(x)  # [B, L, F]
        if self.activation in GATED_ACTIVATIONS:
            gate = self._dense(self.mlp_dim, "wi_gate")(x)  # [B, L, F]
            hidden = activate(gate, self.activation) * hidden
        else:
            hidden = activate(hidden, self.activation)
        # Tensor parallelism splits F; a no-op outside a `parallel.rules` context.
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        hidden = Dropout(self.dropout_rate)(hidden, deterministic=deterministic)
        return self._dense(x.shape[-1], "wo")(hidden)  # [B, L, D]


def activate(x: Array, activation: str) -> Array:
    """The nonlinearity of `activation` (of its gate, for the gated ones), elementwise."""
    if activation == "relu":
        return nn.relu(x)
    if activation == "gelu":
        return nn.gelu(x, approximate=False)
    if activation in ("gelu_tanh", "geglu_tanh"):
        return nn.gelu(x, approximate=True)  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    if activation in ("silu", "swiglu"):
        return nn.silu(x)
    raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS}")


class Embed(nn.Module):
    """Token embedding [V, E] whose transpose doubles as the output projection (tied logits).

    Attributes:
      vocab_size: V.
      features: E.
      scale_by_sqrt_dim: multiply looked-up embeddings by sqrt(E) (Vaswani §3.4).
      base_features: the width W the init std W^-0.5 and the sqrt(W) scale use in place of E
        (μP keeps them at the proxy's width: `tfjax.models.mup`); 0 = E.
    """

    vocab_size: int
    features: int
    scale_by_sqrt_dim: bool = True
    base_features: float = 0.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self):
        init = nn.initializers.normal(stddev=self._width**-0.5)
        self.embedding = self.param(
            "embedding", init, (self.vocab_size, self.features), self.param_dtype
        )

    def __call__(self, tokens: Int[Array, "B L"]) -> Float[Array, "B L E"]:
        """Looks up int32 ids [B, L]; returns [B, L, E] in the compute dtype."""
        # Gathered whole for the lookup (FSDP splits the table; XLA cannot gather rows of a
        # table split along E into a batch-split result); a no-op outside `parallel.rules`.
        table = nn.with_logical_constraint(self.embedding, ("vocab", "embed"))
        x = jnp.take(jnp.asarray(table, self.dtype), tokens, axis=0)
        return x * jnp.sqrt(jnp.asarray(self._width, self.dtype)) if (self.scale_by_sqrt_dim) else x

    @property
    def _width(self) -> float | int:
        return self.base_features or self.features

    def attend(self, x: Float[Array, "B L E"]) -> Float[Array, "B L V"]:
        """Tied pre-softmax projection: logits [B, L, V] = x · embedding^T."""
        return linear.tied_projection(x, jnp.asarray(self.embedding, self.dtype))


class Dropout(nn.Module):
    """Flax's `nn.Dropout` (the same masks from the same keys: same name, same draws) whose
    rate may also be a traced scalar: each trial of a vectorised sweep its own rate. The masks
    come from `prng.bernoulli` (`jax.random.bernoulli`'s bits, unrolled into one kernel).

    Attributes:
      rate: the probability of zeroing an element, a Python float or a traced float32 scalar
        in [0, 1) (a traced 0 keeps every element, as the Python 0 does).
    """

    rate: Any

    @nn.compact
    def __call__(self, inputs: Array, *, deterministic: bool) -> Array:
        static = isinstance(self.rate, numbers.Real)
        if deterministic or (static and self.rate == 0.0):
            return inputs
        if static and self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep_prob = 1.0 - self.rate
        keep = prng.bernoulli(self.make_rng("dropout"), keep_prob, inputs.shape)
        scaled = (inputs / keep_prob).astype(inputs.dtype)
        return jax.lax.select(keep, scaled, jnp.zeros_like(inputs))


class _LayerNormParams(nn.Module):
    """The parameters of `LayerNorm` (same names, shapes and initialisers), returned unused."""

    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, d: int) -> tuple[Array, Array]:
        scale = self.param("scale", nn.initializers.ones, (d,), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (d,), self.param_dtype)
        return scale, bias


class Residual(nn.Module):
    """A residual sub-layer around `fn`: post-LN (paper) or pre-LN, with residual dropout.

    post: norm(x + dropout(fn(x)))   (Vaswani et al. 2017, §3.1, §5.4)
    pre:  x + dropout(fn(norm(x)))   (Xiong et al. 2020)

    `implementation="pallas"` runs the post-LN LayerNorm step as one fused kernel each way
    (`tfjax.nn.fused`; its dropout masks come from a hash, not from `Dropout`'s draws). The
    parameters are the same under either implementation.
    """

    norm_position: str = "post"
    norm: str = "layernorm"
    epsilon: float = 1e-6
    dropout_rate: float | jax.Array = 0.1  # an Array: traced (vectorised sweeps)
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    implementation: str = "xla"

    @nn.compact
    def __call__(
        self,
        x: Float[Array, "B L D"],
        fn: Callable[[Array], Array],
        *,
        deterministic: bool = True,
    ) -> Float[Array, "B L D"]:
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position={self.norm_position!r} is not one of {NORM_POSITIONS}")
        if self.implementation == "pallas":
            return self._fused(x, fn, deterministic=deterministic)
        if self.implementation != "xla":
            raise ValueError(
                f"implementation={self.implementation!r} is not one of {RESIDUAL_IMPLS}"
            )
        norm = norms.make_norm(
            self.norm,
            epsilon=self.epsilon,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="norm",
        )
        dropout = Dropout(self.dropout_rate)
        if self.norm_position == "pre":
            return x + dropout(fn(norm(x)), deterministic=deterministic)
        return norm(x + dropout(fn(x), deterministic=deterministic))

    def _fused(self, x: Array, fn: Callable[[Array], Array], *, deterministic: bool) -> Array:
        from tfjax.nn import fused  # Pallas: imported only when asked for

        if self.norm_position != "post" or self.norm != "layernorm":
            raise ValueError(
                "implementation='pallas' fuses the post-LN LayerNorm step only, got "
                f"norm_position={self.norm_position!r}, norm={self.norm!r}; "
                "use implementation='xla'"
            )
        scale, bias = _LayerNormParams(self.param_dtype, name="norm")(x.shape[-1])
        x = x.astype(self.dtype)
        y = fn(x).astype(self.dtype)
        rate = 0.0 if deterministic else self.dropout_rate  # a traced one: refused by fused
        dropout = isinstance(rate, numbers.Real) and rate > 0
        seeds = fused.make_seeds(self.make_rng("dropout")) if dropout else None
        return fused.dropout_add_layer_norm(x, y, scale, bias, seeds, rate=rate, eps=self.epsilon)
