"""Encoder-only model: [CLS]-pooled classifier or masked-LM head (Devlin et al. 2019, §3)."""

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from tfjax.models import common, kinds, transformer
from tfjax.models.config import ENCODER_HEADS, ModelConfig
from tfjax.nn import layers, linear


class EncoderOnly(nn.Module):
    """Bidirectional encoder with a [CLS]-pooled classifier or a masked-LM head (BERT §3).

    "classify": logits [B, C] from tanh(W h_0 + b) of the first token (BOS doubles as [CLS]);
    "mlm": logits [B, S, V] through dense + GELU + norm and the tied output projection.
    """

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embed = common.make_embed(cfg)
        self.encoder = transformer.Encoder(cfg, self.embed)
        dense = lambda n: nn.Dense(  # noqa: E731
            n,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype,
            dot_general=linear.dense_dot_general,
        )
        if cfg.encoder_head == "classify":
            self.pooler = dense(cfg.embed_dim)
            self.classifier = dense(cfg.num_classes)
            self.head_dropout = layers.Dropout(cfg.dropout_rate)
        else:
            self.mlm_dense = dense(cfg.token_width)
            self.mlm_norm = transformer.config_norm(cfg)
            if not cfg.tie_output:
                self.logits_dense = common.make_logits_dense(cfg)
            elif cfg.has_output_bias:
                self.logits_bias = common.make_logits_bias(self, cfg)

    def __call__(
        self,
        inputs: Int[Array, "B S"],
        *,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
        inputs_positions: Int[Array, "B S"] | None = None,
        inputs_token_types: Int[Array, "B S"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B C"] | Float[Array, "B S V"]:
        """Class logits [B, C] ("classify") or token logits [B, S, V] ("mlm").

        `inputs_token_types` [B, S] (0 = sentence A, 1 = B) need `num_token_types` > 0; None
        means type 0 everywhere.
        """
        x = self.encoder(
            inputs,
            segment_ids=inputs_segment_ids,
            positions=inputs_positions,
            token_types=inputs_token_types,
            deterministic=deterministic,
        )  # [B, S, D]
        if self.config.encoder_head == "classify":
            pooled = jnp.tanh(self.pooler(x[:, 0]))  # [B, D]
            pooled = self.head_dropout(pooled, deterministic=deterministic)
            return self.classifier(common.readout_input(self.config, pooled))
        x = self.mlm_norm(nn.gelu(self.mlm_dense(x), approximate=False))  # [B, S, E]
        x = common.readout_input(self.config, x)
        if not self.config.tie_output:
            return self.logits_dense(x)
        logits = self.embed.attend(x)  # [B, S, V]
        return (
            logits + self.logits_bias.astype(logits.dtype)
            if self.config.has_output_bias
            else logits
        )


def _counts(cfg: ModelConfig, source_len: int, target_len: int) -> kinds.Counts:
    """Self-attention S x S; the output is every position (MLM head) or one row (classifier)."""
    mlm = cfg.encoder_head == "mlm"
    return kinds.Counts(
        attention_pairs=cfg.num_layers * source_len * source_len,
        output_tokens=source_len if mlm else 1,
        vocab_output=cfg.encoder_head != "classify",
    )


KIND = kinds.register(
    kinds.ModelKind(
        name="encoder_only",
        model=EncoderOnly,
        fields=("inputs",),
        data_format="classify",
        scores="labels",
        counts=_counts,
        decoding=None,
        facade="trained",
        tool="experiments.evaluate",
        train_example="configs/classify.py:cpu",
        heads=ENCODER_HEADS,
    )
)
