"""Transformer layers and stacks of a `ModelConfig`, shared by the three models.

Sources: Vaswani et al. 2017, §3.1 (encoder and decoder stacks, N = 6 identical layers, each
sub-layer wrapped in a residual connection and a norm), §3.4 (embeddings) and §3.5 (positions,
dropout on their sum); relative position bias shared across layers: Raffel et al. 2020 (T5), §2.1;
ALiBi: Press et al. 2022, §3; restricted self-attention: Vaswani §4, Table 1.

The stacks run their layers through `stacking.apply_layers`: a Python loop over "layer_{i}"
submodules, or one `nn.scan` over a "layers" submodule (`ModelConfig.scan_layers`), each
optionally rematerialised (`ModelConfig.remat`).
"""

import functools

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from tfjax.models import mup
from tfjax.models.config import ModelConfig
from tfjax.nn import attention, layers, masking, norms, positional, stacking


class Embedder(nn.Module):
    """Token embeddings plus (or concatenated with) absolute positions, then dropout (§3.4-3.5)."""

    config: ModelConfig
    embed: layers.Embed

    @nn.compact
    def __call__(
        self,
        tokens: Int[Array, "B L"],
        positions: Int[Array, "B L"],
        *,
        deterministic: bool,
        token_types: Int[Array, "B L"] | None = None,
    ) -> Float[Array, "B L D"]:
        cfg = self.config
        x = self.embed(tokens)  # [B, L, E]
        if cfg.positional == "sinusoidal":
            pos = positional.sinusoidal_embedding(
                positions,
                cfg.position_width,
                base=cfg.sinusoidal_base,
                layout=cfg.sinusoidal_layout,
            )  # [B, L, P]
        elif cfg.positional == "learned":
            pos = positional.LearnedPositionalEmbedding(
                cfg.max_len,
                cfg.position_width,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.params_dtype,
                name="pos_embedding",
            )(positions)
        else:
            pos = None
        if pos is not None:
            x = positional.combine_embeddings(x, pos.astype(x.dtype), cfg.positional_combine)
        if cfg.num_token_types:
            x = x + self._token_types(tokens, token_types, x.shape[-1]).astype(x.dtype)
        elif token_types is not None:
            raise ValueError("token_types need ModelConfig.num_token_types > 0")
        if cfg.embedding_norm:
            x = config_norm(cfg, "norm")(x)
        x = layers.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)  # [B, L, D]
        return constrain_embed(x)

    def _token_types(self, tokens: Array, token_types: Array | None, width: int) -> Array:
        """[B, L, D] rows of the learned "token_type_embedding" [T, D] (type 0 by default)."""
        cfg = self.config
        table = self.param(
            "token_type_embedding",
            nn.initializers.normal(stddev=0.02),
            (cfg.num_token_types, width),
            cfg.params_dtype,
        )  # [T, D]
        types = jnp.zeros_like(tokens) if token_types is None else token_types  # [B, L]
        return jnp.take(table, types, axis=0)  # [B, L, D]


def config_norm(cfg: ModelConfig, name: str | None = None) -> nn.Module:
    """The config's norm (`ModelConfig.norm`, its epsilon and dtypes) named `name`."""
    return norms.make_norm(
        cfg.norm,
        epsilon=cfg.layer_norm_epsilon,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        name=name,
    )


def constrain_embed(x: Float[Array, "B L D"]) -> Float[Array, "B L D"]:
    """The residual stream pinned to the layout of ("batch", "length", "embed"); a no-op
    outside a `parallel.rules` context (`tfjax.parallel.layout`)."""
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


def _attention(
    cfg: ModelConfig, name: str, *, self_attention: bool
) -> attention.MultiHeadAttention:
    return attention.MultiHeadAttention(
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        score=cfg.score,
        dropout_rate=cfg.attention_dropout_rate,
        fused_qkv=cfg.fused_qkv,
        value_rank=cfg.value_rank,
        rotary=self_attention and cfg.positional == "rotary",
        rope_base=cfg.rope_base,
        use_bias=cfg.use_bias,
        implementation=cfg.attention_impl,
        cross=not self_attention,
        query_scale=mup.query_multiplier(cfg),
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        name=name,
    )


def _residual(cfg: ModelConfig, name: str) -> layers.Residual:
    return layers.Residual(
        cfg.norm_position,
        cfg.norm,
        cfg.layer_norm_epsilon,
        cfg.dropout_rate,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        implementation=cfg.residual_impl,
        name=name,
    )


def _feed_forward(cfg: ModelConfig) -> layers.FeedForward:
    return layers.FeedForward(
        cfg.mlp_dim,
        cfg.activation,
        dropout_rate=cfg.dropout_rate if cfg.mlp_dropout else 0.0,
        use_bias=cfg.use_bias,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
        name="mlp",
    )


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sub-layers, each residual with a norm (§3.1)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, x: Float[Array, "B S D"], *, mask, bias, window, positions, deterministic: bool
    ) -> Float[Array, "B S D"]:
        cfg = self.config
        attn = _attention(cfg, "self_attention", self_attention=True)
        x = _residual(cfg, "self_attention_residual")(
            x,
            lambda h: attn(
                h,
                mask=mask,
                bias=bias,
                window=window,
                q_positions=positions,
                deterministic=deterministic,
            ),
            deterministic=deterministic,
        )
        mlp = _feed_forward(cfg)
        x = _residual(cfg, "mlp_residual")(
            x, lambda h: mlp(h, deterministic=deterministic), deterministic=deterministic
        )
        return constrain_embed(x)  # the residual stream between layers


class DecoderLayer(nn.Module):
    """Masked self-attention, optional cross-attention over the encoder output, feed-forward.

    With `decode=True` both attentions use the "cache" collection (see
    `attention.MultiHeadAttention`); `encoded` may then be None to reuse the cached encoder keys.
    Self-attention takes either `mask` and `bias` or a `window` (`attention.local.Window`).
    """

    config: ModelConfig
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        x: Float[Array, "B L D"],
        *,
        encoded,
        mask,
        cross_mask,
        bias,
        positions,
        deterministic: bool,
        window=None,
        decode: bool = False,
    ) -> Float[Array, "B L D"]:
        cfg = self.config
        attn = _attention(cfg, "self_attention", self_attention=True)
        x = _residual(cfg, "self_attention_residual")(
            x,
            lambda h: attn(
                h,
                mask=mask,
                bias=bias,
                window=window,
                q_positions=positions,
                deterministic=deterministic,
                decode=decode,
            ),
            deterministic=deterministic,
        )
        if self.cross_attention:
            cross = _attention(cfg, "cross_attention", self_attention=False)
            x = _residual(cfg, "cross_attention_residual")(
                x,
                lambda h: cross(
                    h, encoded, mask=cross_mask, deterministic=deterministic, decode=decode
                ),
                deterministic=deterministic,
            )
        mlp = _feed_forward(cfg)
        x = _residual(cfg, "mlp_residual")(
            x, lambda h: mlp(h, deterministic=deterministic), deterministic=deterministic
        )
        return constrain_embed(x)  # the residual stream between layers


class _Stack(nn.Module):
    """Shared helpers of the encoder and decoder stacks."""

    def _relative_bias(self, *, bidirectional: bool) -> positional.RelativePositionBias:
        cfg = self.config
        return positional.RelativePositionBias(
            cfg.num_heads,
            cfg.relative_num_buckets,
            cfg.relative_max_distance,
            bidirectional=bidirectional,
            dtype=cfg.compute_dtype,
            param_dtype=cfg.params_dtype,
            name="relative_bias",
        )

    def _position_bias(
        self, q_positions: Array, kv_positions: Array, *, bidirectional: bool
    ) -> Array | None:
        """Relative or ALiBi logit bias [B, N, L, S], computed once and shared by all layers."""
        cfg = self.config
        if cfg.positional == "relative":
            return self._relative_bias(bidirectional=bidirectional)(q_positions, kv_positions)
        if cfg.positional == "alibi":
            slopes = positional.alibi_slopes(cfg.num_heads)
            return positional.alibi_bias(q_positions, kv_positions, slopes)
        return None

    def _window(
        self, segment_ids: Array | None, positions: Array | None, *, causal: bool
    ) -> attention.local.Window | None:
        """Restricted self-attention (`window_radius` r > 0) for the blocked O(L · r) path, and
        with `attention_impl="chunked"` the structure of any self-attention (radius None without
        a window) for the chunked path, which never builds [L, L] masks either.

        The relative or ALiBi bias goes in as a function of key - query offsets, evaluated per
        block: the same bias as `_position_bias`, never built as [L, L]. Positions are those
        the caller gave (None: 0..L-1, which the blocked path needs only for one block).
        """
        cfg = self.config
        if not cfg.window_radius and cfg.attention_impl != "chunked":
            return None
        offset_bias = None
        if cfg.positional == "relative":
            offset_bias = self._relative_bias(bidirectional=not causal).offset_bias()
        elif cfg.positional == "alibi":
            slopes = positional.alibi_slopes(cfg.num_heads)
            offset_bias = functools.partial(positional.alibi_offset_bias, slopes=slopes)
        return attention.local.Window(
            cfg.window_radius or None, causal, segment_ids, positions, offset_bias=offset_bias
        )

    def _final(self, x: Array, *, deterministic: bool) -> Array:
        """The final norm of a pre-LN stack (`use_final_norm`), then dropout with `final_dropout`
        (T5)."""
        cfg = self.config
        if cfg.use_final_norm:
            x = config_norm(cfg, "final_norm")(x)
        if cfg.final_dropout:
            x = layers.Dropout(cfg.dropout_rate, name="final_dropout")(
                x, deterministic=deterministic
            )
        return x


class Encoder(_Stack):
    """Embeddings and `num_layers` encoder layers; bidirectional within each segment.

    With `window_radius` r > 0 self-attention is restricted to |i - j| <= r through
    `attention.local.Window`: blocked, O(L · r), for the dot scores (see `window_attention`).
    """

    config: ModelConfig
    embed: layers.Embed

    @nn.compact
    def __call__(
        self,
        tokens: Int[Array, "B S"],
        *,
        segment_ids: Int[Array, "B S"] | None,
        positions: Int[Array, "B S"] | None,
        deterministic: bool,
        token_types: Int[Array, "B S"] | None = None,
    ) -> Float[Array, "B S D"]:
        cfg = self.config
        window = self._window(segment_ids, positions, causal=False)
        lengths = _as_lengths(cfg, positions)
        positions = positional.default_positions(tokens) if positions is None else positions
        x = Embedder(cfg, self.embed, name="embedder")(
            tokens, positions, deterministic=deterministic, token_types=token_types
        )
        mask = bias = None
        if window is None:
            bias = self._position_bias(positions, positions, bidirectional=True)
            if lengths and bias is None:
                source_lengths = _lengths(segment_ids)
                mask = attention.Lengths(source_lengths, source_lengths)
            elif segment_ids is not None:
                mask = masking.segment_mask(segment_ids)
        x = stacking.apply_layers(
            lambda name: EncoderLayer(cfg, name=name),
            x,
            cfg.num_layers,
            scan=cfg.scan_layers,
            remat=cfg.remat,
            mask=mask,
            bias=bias,
            window=window,
            positions=positions,
            deterministic=deterministic,
        )
        return self._final(x, deterministic=deterministic)


class Decoder(_Stack):
    """Embeddings and decoder layers with causal self-attention (and cross-attention).

    With `decode=True` the tokens are the L new decoder inputs (usually L = 1) at `positions`,
    and self-attention runs over the key/value cache: slot j holds position j, so a query at
    position p sees slots j <= p (and p - j <= window radius). Cross-attention reuses the cached
    encoder keys when `encoded` is None. Packed segments are not supported while decoding.
    Outside decoding a window radius r > 0 takes the blocked O(L · r) path, as in `Encoder`.
    """

    config: ModelConfig
    embed: layers.Embed
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        tokens: Int[Array, "B L"],
        *,
        encoded: Array | None = None,
        segment_ids: Int[Array, "B L"] | None,
        positions: Int[Array, "B L"] | None,
        encoded_segment_ids: Array | None = None,
        deterministic: bool,
        decode: bool = False,
    ) -> Float[Array, "B L D"]:
        cfg = self.config
        if decode and (positions is None or segment_ids is not None):
            raise ValueError("decode=True needs the new tokens' positions and no segment_ids")
        window = None if decode else self._window(segment_ids, positions, causal=True)
        lengths = not decode and _as_lengths(cfg, positions)
        positions = positional.default_positions(tokens) if positions is None else positions
        x = Embedder(cfg, self.embed, name="embedder")(
            tokens, positions, deterministic=deterministic
        )
        mask = bias = None
        if decode:
            mask, bias = self._decode_mask_and_bias(positions, tokens.shape[1])
        elif window is None:
            bias = self._position_bias(positions, positions, bidirectional=False)
            if lengths and bias is None:
                target_lengths = _lengths(segment_ids)
                mask = attention.Lengths(target_lengths, target_lengths, causal=True)
            else:
                mask = self._causal_mask(tokens.shape[1], segment_ids)
        cross_mask = None
        if self.cross_attention and lengths:
            cross_mask = attention.Lengths(_lengths(segment_ids), _lengths(encoded_segment_ids))
        elif self.cross_attention:
            cross_mask = _cross_mask(tokens, encoded, segment_ids, encoded_segment_ids)
        num_layers = cfg.num_decoder_layers if self.cross_attention else cfg.num_layers
        x = stacking.apply_layers(
            lambda name: DecoderLayer(cfg, self.cross_attention, name=name),
            x,
            num_layers,
            scan=cfg.scan_layers,
            remat=cfg.remat,
            encoded=encoded,
            mask=mask,
            cross_mask=cross_mask,
            bias=bias,
            window=window,
            positions=positions,
            deterministic=deterministic,
            decode=decode,
        )
        return self._final(x, deterministic=deterministic)

    def _causal_mask(self, length: int, segment_ids: Array | None) -> Array:
        """[B|1, 1, L, L]: causal, within segments (without a window; see `_window`)."""
        return masking.combine_masks(
            masking.causal_mask(length),
            None if segment_ids is None else masking.segment_mask(segment_ids),
        )

    def _decode_mask_and_bias(self, positions: Array, length: int) -> tuple[Array, Array | None]:
        """Mask [B, 1, L, S] and bias [B, N, L, S] of new queries against the S cache slots."""
        kv_length = self._cache_length(length)
        mask = masking.cached_causal_mask(
            positions, kv_length, window_radius=self.config.window_radius
        )
        kv_positions = jnp.arange(kv_length, dtype=jnp.int32)  # [S]
        kv_positions = jnp.broadcast_to(kv_positions, (positions.shape[0], kv_length))  # [B, S]
        return mask, self._position_bias(positions, kv_positions, bidirectional=False)

    def _cache_length(self, length: int) -> int:
        """S, the slots of the self-attention cache; `length` while the cache is being created."""
        first = stacking.layer_name(0, scan=self.config.scan_layers)
        layer = self.variables.get("cache", {}).get(first, {}).get("self_attention", {})
        # [B, K, S, H], or [num_layers, B, K, S, H] in a scanned stack.
        return layer["cached_key"].shape[-2] if "cached_key" in layer else length


def _as_lengths(cfg: ModelConfig, positions: Array | None) -> bool:
    """Whether this stack's masks go to attention as `attention.Lengths`: with cuDNN's fused
    attention, for unpacked rows. Rows come unpacked (one sequence each, padded at the end)
    when the caller gives no positions; packed batches carry per-segment positions (the data
    pipeline's `*_positions`) and keep the dense segment masks."""
    return cfg.attention_impl == "cudnn" and positions is None


def _lengths(segment_ids: Array | None) -> Array | None:
    """[B] int32 tokens per row (non-zero segment ids), or None for no padding."""
    if segment_ids is None:
        return None
    return jnp.sum(segment_ids != 0, axis=1, dtype=jnp.int32)


def _cross_mask(
    tokens: Array, encoded: Array | None, segment_ids: Array | None, encoded_segment_ids
) -> Array | None:
    """[B, 1, L, S] decoder-encoder mask from segment ids, or None when there are none."""
    if segment_ids is None and encoded_segment_ids is None:
        return None
    q_seg = jnp.ones_like(tokens) if segment_ids is None else segment_ids
    kv_seg = (
        jnp.ones(encoded.shape[:2], jnp.int32)
        if encoded_segment_ids is None
        else encoded_segment_ids
    )
    return masking.cross_attention_mask(q_seg, kv_seg)
