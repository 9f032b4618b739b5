"""Decoder-only causal language model (Radford et al. 2018, §3.1; Liu et al. 2018, §4)."""

import flax.linen as nn
from jaxtyping import Array, Float, Int

from tfjax.models import common, kinds, transformer
from tfjax.models.config import ModelConfig


class DecoderOnly(nn.Module, common.OutputMixin):
    """Causal language model: logits [B, L, V] where position t sees targets[:t] only."""

    config: ModelConfig

    def setup(self):
        self.embed = common.make_embed(self.config)
        self.decoder = transformer.Decoder(self.config, self.embed, cross_attention=False)
        self._make_output()

    def __call__(
        self,
        targets: Int[Array, "B L"],
        *,
        targets_segment_ids: Int[Array, "B L"] | None = None,
        targets_positions: Int[Array, "B L"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B L V"]:
        """Next-token logits; inputs are `targets` shifted right with BOS (per segment)."""
        decoder_inputs = common.shift_right(targets, self.config.bos_id, targets_segment_ids)
        x = self.decoder(
            decoder_inputs,
            segment_ids=targets_segment_ids,
            positions=targets_positions,
            deterministic=deterministic,
        )
        return self._logits(x)

    def decode_step(
        self, tokens: Int[Array, "B L"], *, positions: Int[Array, "B L"]
    ) -> Float[Array, "B L V"]:
        """Cached step: [B, 1] inputs (BOS, then previous outputs) at [B, 1] positions -> logits."""
        x = self.decoder(
            tokens, segment_ids=None, positions=positions, deterministic=True, decode=True
        )
        return self._logits(x)


def _counts(cfg: ModelConfig, source_len: int, target_len: int) -> kinds.Counts:
    """Causal self-attention L x L in each layer; every position is an output."""
    pairs = cfg.num_layers * target_len * target_len
    return kinds.Counts(attention_pairs=pairs, output_tokens=target_len, vocab_output=True)


KIND = kinds.register(
    kinds.ModelKind(
        name="decoder_only",
        model=DecoderOnly,
        fields=("targets",),
        data_format="lm",
        scores="targets",
        counts=_counts,
        decoding="prompt",
        facade="generator",
        tool="experiments.generate",
        train_example="configs/lm.py:cpu",
    )
)
