"""The Transformer of Vaswani et al. 2017 (§3, Table 3): encoder-decoder, KV-cached decoding."""

import flax.linen as nn
from jaxtyping import Array, Float, Int

from tfjax.models import common, kinds, transformer
from tfjax.models.config import ModelConfig


class EncoderDecoder(nn.Module, common.OutputMixin):
    """The Transformer of Vaswani et al. 2017: `encode` the source, `decode` the target.

    Parameters: "embed" (shared by source, target and the output when `share_embeddings` and
    `tie_output`), "encoder", "decoder".
    """

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embed = common.make_embed(cfg)
        source_embed = self.embed if cfg.share_embeddings else common.make_embed(cfg)
        self.encoder = transformer.Encoder(cfg, source_embed)
        self.decoder = transformer.Decoder(cfg, self.embed, cross_attention=True)
        self._make_output()

    def encode(
        self,
        inputs: Int[Array, "B S"],
        *,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
        inputs_positions: Int[Array, "B S"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B S D"]:
        """Encodes source ids [B, S]; segment id 0 marks padding (None = no padding)."""
        return self.encoder(
            inputs,
            segment_ids=inputs_segment_ids,
            positions=inputs_positions,
            deterministic=deterministic,
        )

    def decode(
        self,
        encoded: Float[Array, "B S D"],
        targets: Int[Array, "B L"],
        *,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
        targets_segment_ids: Int[Array, "B L"] | None = None,
        targets_positions: Int[Array, "B L"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B L V"]:
        """Teacher-forced logits [B, L, V]: position t sees targets[:t] and the whole source."""
        decoder_inputs = common.shift_right(targets, self.config.bos_id, targets_segment_ids)
        x = self.decoder(
            decoder_inputs,
            encoded=encoded,
            segment_ids=targets_segment_ids,
            positions=targets_positions,
            encoded_segment_ids=inputs_segment_ids,
            deterministic=deterministic,
        )
        return self._logits(x)

    def decode_step(
        self,
        tokens: Int[Array, "B L"],
        *,
        positions: Int[Array, "B L"],
        encoded: Float[Array, "B S D"] | None = None,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
    ) -> Float[Array, "B L V"]:
        """One cached decoding step (apply with `mutable=["cache"]`; see `inference.decoding`).

        Args:
          tokens: [B, 1] decoder inputs, not shifted: BOS at step 0, then the previous outputs
            (the full [B, max_len] when `init` creates the cache).
          positions: [B, 1] int positions of `tokens` (= the cache slot they are written to).
          encoded: [B, S, D] encoder output: given, it (re)fills the cross-attention cache;
            None reuses the cached encoder keys/values.
          inputs_segment_ids: [B, S] source segment ids (0 = padding), or None.

        Returns:
          [B, 1, V] next-token logits.
        """
        x = self.decoder(
            tokens,
            encoded=encoded,
            segment_ids=None,
            positions=positions,
            encoded_segment_ids=inputs_segment_ids,
            deterministic=True,
            decode=True,
        )
        return self._logits(x)

    def __call__(
        self,
        inputs: Int[Array, "B S"],
        targets: Int[Array, "B L"],
        *,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
        targets_segment_ids: Int[Array, "B L"] | None = None,
        inputs_positions: Int[Array, "B S"] | None = None,
        targets_positions: Int[Array, "B L"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B L V"]:
        """Logits [B, L, V] for `targets` given `inputs` (keyword names match batch keys)."""
        encoded = self.encode(
            inputs,
            inputs_segment_ids=inputs_segment_ids,
            inputs_positions=inputs_positions,
            deterministic=deterministic,
        )
        return self.decode(
            encoded,
            targets,
            inputs_segment_ids=inputs_segment_ids,
            targets_segment_ids=targets_segment_ids,
            targets_positions=targets_positions,
            deterministic=deterministic,
        )


def _counts(cfg: ModelConfig, source_len: int, target_len: int) -> kinds.Counts:
    """Encoder self-attention S x S, decoder self-attention L x L and cross-attention L x S."""
    pairs = cfg.num_layers * source_len * source_len
    pairs += cfg.num_decoder_layers * (target_len * target_len + target_len * source_len)
    return kinds.Counts(attention_pairs=pairs, output_tokens=target_len, vocab_output=True)


KIND = kinds.register(
    kinds.ModelKind(
        name="encoder_decoder",
        model=EncoderDecoder,
        fields=("inputs", "targets"),
        data_format="seq2seq",
        scores="targets",
        counts=_counts,
        decoding="source",
        facade="translator",
        tool="experiments.translate",
        train_example="configs/base.py:cpu",
    )
)
