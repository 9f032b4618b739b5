"""What the three models share: decoder inputs, the token table and the output layer."""

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Int

from tfjax.models import mup
from tfjax.models.config import ModelConfig
from tfjax.nn import layers, linear


def shift_right(
    targets: Int[Array, "B L"], bos_id: int, segment_ids: Int[Array, "B L"] | None = None
) -> Int[Array, "B L"]:
    """Decoder inputs: targets moved one step right with BOS at the start of every segment.

    With packed rows (segment ids), each segment starts with BOS and padding stays 0.
    """
    shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]  # [B, L]
    if segment_ids is None:
        return shifted
    previous = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]  # [B, L]
    shifted = jnp.where(segment_ids != previous, bos_id, shifted)
    return jnp.where(segment_ids == 0, 0, shifted)


class OutputMixin:
    """Shared logits layer: tied to the token table (Vaswani §3.4) or a separate dense."""

    def _make_output(self):
        cfg = self.config
        if not cfg.tie_output:
            self.logits_dense = make_logits_dense(cfg)
            return
        if cfg.has_output_bias:
            self.logits_bias = make_logits_bias(self, cfg)
        if cfg.positional_combine == "concat":
            # Token embeddings are narrower than D when positions are concatenated.
            self.logits_proj = nn.Dense(
                cfg.token_width,
                use_bias=False,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.params_dtype,
                dot_general=linear.dense_dot_general,
            )

    def _logits(self, x: Array) -> Array:
        cfg = self.config
        if cfg.rescale_output:  # T5 v1.0: tied to unscaled embeddings (Mesh TensorFlow)
            x = x * jnp.asarray(cfg.embed_dim**-0.5, x.dtype)
        x = readout_input(cfg, x)
        if not cfg.tie_output:
            return self.logits_dense(x)
        if cfg.positional_combine == "concat":
            x = self.logits_proj(x)
        logits = self.embed.attend(x)
        return logits + self.logits_bias.astype(logits.dtype) if cfg.has_output_bias else logits


def readout_input(cfg: ModelConfig, x: Array) -> Array:
    """The readout's input times μP's multiplier base_width / embed_dim (`tfjax.models.mup`);
    `x` itself under the standard parametrization or at base_width."""
    multiplier = mup.readout_multiplier(cfg)
    return x if multiplier == 1.0 else x * jnp.asarray(multiplier, x.dtype)


def make_logits_dense(cfg: ModelConfig) -> nn.Dense:
    """The untied output layer D -> V, with a bias unless `output_bias="off"`."""
    return nn.Dense(
        cfg.vocab_size,
        use_bias=cfg.has_output_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        dot_general=linear.dense_dot_general,
    )


def make_logits_bias(module: nn.Module, cfg: ModelConfig) -> Array:
    """The "logits_bias" [V] parameter of tied logits (`ModelConfig.output_bias`), zeros."""
    return module.param("logits_bias", nn.initializers.zeros, (cfg.vocab_size,), cfg.params_dtype)


def make_embed(cfg: ModelConfig) -> layers.Embed:
    return layers.Embed(
        cfg.vocab_size,
        cfg.token_width,
        scale_by_sqrt_dim=cfg.scale_embeddings,
        base_features=mup.embed_base_features(cfg),
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
    )
