"""Decoder-only causal language model (Radford et al. 2018, §3.1; Liu et al. 2018, §4)."""

import flax.linen as nn
from jaxtyping import Array, Float, Int

from tfjax.models import common, transformer
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
