"""The model configuration and the three Transformers: encoder-decoder, encoder-only, decoder-only.

Sources:
- encoder-decoder Transformer, base and big sizes: Vaswani et al. 2017, §3 and Table 3;
- encoder-only with a [CLS]-pooled classifier and a masked-LM head: Devlin et al. 2019 (BERT),
  §3 and Appendix A;
- decoder-only causal language model: Radford et al. 2018 (GPT), §3.1; Liu et al. 2018, §4.

`ModelConfig` is built as `ModelConfig(**config.model)` from an ml_collections config; it is
frozen and validated on construction. The stacks live in `tfjax.transformer`.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from tfjax import attention, layers, linear, positional, transformer

KINDS = ("encoder_decoder", "encoder_only", "decoder_only")
POSITIONALS = ("sinusoidal", "learned", "relative", "rotary", "alibi", "none")
ENCODER_HEADS = ("classify", "mlm")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of every model; defaults are the paper's base model (Vaswani Table 3).

    Sizes: `embed_dim` D, `num_layers` (encoder, or the only stack of the decoder-only model),
    `num_decoder_layers` (decoder of the encoder-decoder),
    `num_heads` N, `num_kv_heads` K (0 = N), `head_dim` H (0 = D // N), `mlp_dim` F,
    `max_len` (longest position for learned tables), `vocab_size` V (shared by source and target).
    Options name one of the module-level tuples (`POSITIONALS`, `attention.SCORES`, ...);
    `window_radius` r > 0 restricts self-attention to |i - j| <= r; `value_rank` r > 0 factorises
    the value projection; `positional_dim` is the position width when positions are concatenated.
    `dtype` is the compute dtype and `param_dtype` the storage dtype (names as strings).
    """

    kind: str = "encoder_decoder"
    vocab_size: int = 37000
    embed_dim: int = 512
    num_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 0
    head_dim: int = 0
    mlp_dim: int = 2048
    max_len: int = 512
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    score: str = "scaled_dot"
    attention_impl: str = "auto"
    fused_qkv: bool = True
    value_rank: int = 0
    window_radius: int = 0
    positional: str = "sinusoidal"
    positional_combine: str = "add"
    positional_dim: int = 0
    sinusoidal_base: float = 10000.0
    sinusoidal_layout: str = "interleaved"
    rope_base: float = 10000.0
    relative_num_buckets: int = 32
    relative_max_distance: int = 128
    norm: str = "layernorm"
    norm_position: str = "post"
    final_norm: bool = False
    layer_norm_epsilon: float = 1e-6
    activation: str = "relu"
    use_bias: bool = True
    share_embeddings: bool = True
    tie_output: bool = True
    scale_embeddings: bool = True
    encoder_head: str = "classify"
    num_classes: int = 2
    bos_id: int = 1
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        _check_choices(self)
        _check_sizes(self)
        _check_cudnn(self)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def token_width(self) -> int:
        """Width of the token embeddings: D, or D - positional_dim when positions are concat."""
        concat = self.positional_combine == "concat"
        return self.embed_dim - self.positional_dim if concat else self.embed_dim

    @property
    def position_width(self) -> int:
        return self.positional_dim if self.positional_combine == "concat" else self.embed_dim

    @property
    def use_final_norm(self) -> bool:
        """Pre-LN stacks always end with a norm; post-LN ones only when asked (PyTorch has one)."""
        return self.final_norm or self.norm_position == "pre"


_CHOICES = {
    "kind": KINDS,
    "positional": POSITIONALS,
    "positional_combine": positional.COMBINE_MODES,
    "sinusoidal_layout": positional.SINUSOIDAL_LAYOUTS,
    "score": attention.SCORES,
    "attention_impl": attention.IMPLEMENTATIONS,
    "norm": layers.NORMS,
    "norm_position": layers.NORM_POSITIONS,
    "activation": layers.ACTIVATIONS,
    "encoder_head": ENCODER_HEADS,
    "dtype": DTYPES,
    "param_dtype": DTYPES,
}


def _check_choices(cfg: ModelConfig) -> None:
    for field, allowed in _CHOICES.items():
        if getattr(cfg, field) not in allowed:
            raise ValueError(f"ModelConfig.{field}={getattr(cfg, field)!r} is not one of {allowed}")


def _check_cudnn(cfg: ModelConfig) -> None:
    """attention_impl="cudnn" needs 16-bit compute, a dot score and no probability dropout."""
    if cfg.attention_impl != "cudnn":
        return
    problems = []
    if cfg.dtype not in ("bfloat16", "float16"):
        problems.append(f"dtype={cfg.dtype!r} (set dtype='bfloat16')")
    if cfg.score not in ("scaled_dot", "dot"):
        problems.append(f"score={cfg.score!r} (cuDNN runs the dot scores)")
    if cfg.attention_dropout_rate > 0:
        problems.append(f"attention_dropout_rate={cfg.attention_dropout_rate} (set it to 0)")
    if problems:
        raise ValueError(
            "ModelConfig.attention_impl='cudnn' cannot run with "
            + ", ".join(problems)
            + "; or use attention_impl='auto'"
        )


def _check_sizes(cfg: ModelConfig) -> None:
    positive = (
        "vocab_size",
        "embed_dim",
        "num_layers",
        "num_heads",
        "mlp_dim",
        "max_len",
        "num_classes",
        "relative_num_buckets",
        "relative_max_distance",
    )
    for field in positive:
        if getattr(cfg, field) <= 0:
            raise ValueError(f"ModelConfig.{field} must be > 0, got {getattr(cfg, field)}")
    for field in (
        "num_decoder_layers",
        "num_kv_heads",
        "head_dim",
        "value_rank",
        "window_radius",
        "positional_dim",
    ):
        if getattr(cfg, field) < 0:
            raise ValueError(f"ModelConfig.{field} must be >= 0, got {getattr(cfg, field)}")
    if not cfg.head_dim and cfg.embed_dim % cfg.num_heads:
        raise ValueError(
            f"ModelConfig.embed_dim={cfg.embed_dim} must be divisible by num_heads="
            f"{cfg.num_heads} (or set head_dim)"
        )
    if cfg.num_kv_heads and cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"ModelConfig.num_heads={cfg.num_heads} must be divisible by num_kv_heads="
            f"{cfg.num_kv_heads}"
        )
    for field in ("dropout_rate", "attention_dropout_rate"):
        if not 0.0 <= getattr(cfg, field) < 1.0:
            raise ValueError(f"ModelConfig.{field} must be in [0, 1), got {getattr(cfg, field)}")
    _check_positions(cfg)


def _check_positions(cfg: ModelConfig) -> None:
    if cfg.positional_combine != "concat":
        return
    if cfg.positional not in ("sinusoidal", "learned"):
        raise ValueError(
            f"ModelConfig.positional_combine='concat' needs positional in ('sinusoidal', "
            f"'learned'), got {cfg.positional!r}"
        )
    if not 0 < cfg.positional_dim < cfg.embed_dim or cfg.positional_dim % 2:
        raise ValueError(
            f"ModelConfig.positional_dim must be even and in (0, embed_dim={cfg.embed_dim}) "
            f"when positions are concatenated, got {cfg.positional_dim}"
        )


PRESETS = {
    # Vaswani et al. 2017, Table 3: base 65M and big 213M parameters (37k shared BPE vocabulary).
    "base": {},
    "big": {"embed_dim": 1024, "mlp_dim": 4096, "num_heads": 16, "dropout_rate": 0.3},
}


def preset(name: str, **overrides) -> ModelConfig:
    """The paper's "base" or "big" model, with optional field overrides."""
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is not one of {tuple(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


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


class _OutputMixin:
    """Shared logits layer: tied to the token table (Vaswani §3.4) or a separate dense."""

    def _make_output(self):
        cfg = self.config
        if not cfg.tie_output:
            self.logits_dense = nn.Dense(
                cfg.vocab_size,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.params_dtype,
                dot_general=linear.dense_dot_general,
            )
        elif cfg.positional_combine == "concat":
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
        if not cfg.tie_output:
            return self.logits_dense(x)
        if cfg.positional_combine == "concat":
            x = self.logits_proj(x)
        return self.embed.attend(x)


def _make_embed(cfg: ModelConfig) -> layers.Embed:
    return layers.Embed(
        cfg.vocab_size,
        cfg.token_width,
        scale_by_sqrt_dim=cfg.scale_embeddings,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.params_dtype,
    )


class EncoderDecoder(nn.Module, _OutputMixin):
    """The Transformer of Vaswani et al. 2017: `encode` the source, `decode` the target.

    Parameters: "embed" (shared by source, target and the output when `share_embeddings` and
    `tie_output`), "encoder", "decoder".
    """

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embed = _make_embed(cfg)
        source_embed = self.embed if cfg.share_embeddings else _make_embed(cfg)
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
        decoder_inputs = shift_right(targets, self.config.bos_id, targets_segment_ids)
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
        """One cached decoding step (apply with `mutable=["cache"]`; see `tfjax.decoding`).

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


class EncoderOnly(nn.Module):
    """Bidirectional encoder with a [CLS]-pooled classifier or a masked-LM head (BERT §3).

    "classify": logits [B, C] from tanh(W h_0 + b) of the first token (BOS doubles as [CLS]);
    "mlm": logits [B, S, V] through dense + GELU + norm and the tied output projection.
    """

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embed = _make_embed(cfg)
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
            self.head_dropout = nn.Dropout(cfg.dropout_rate)
        else:
            self.mlm_dense = dense(cfg.token_width)
            self.mlm_norm = layers.make_norm(
                cfg.norm,
                epsilon=cfg.layer_norm_epsilon,
                dtype=cfg.compute_dtype,
                param_dtype=cfg.params_dtype,
            )
            if not cfg.tie_output:
                self.logits_dense = dense(cfg.vocab_size)

    def __call__(
        self,
        inputs: Int[Array, "B S"],
        *,
        inputs_segment_ids: Int[Array, "B S"] | None = None,
        inputs_positions: Int[Array, "B S"] | None = None,
        deterministic: bool = True,
    ) -> Float[Array, "B C"] | Float[Array, "B S V"]:
        """Class logits [B, C] ("classify") or token logits [B, S, V] ("mlm")."""
        x = self.encoder(
            inputs,
            segment_ids=inputs_segment_ids,
            positions=inputs_positions,
            deterministic=deterministic,
        )  # [B, S, D]
        if self.config.encoder_head == "classify":
            pooled = jnp.tanh(self.pooler(x[:, 0]))  # [B, D]
            return self.classifier(self.head_dropout(pooled, deterministic=deterministic))
        x = self.mlm_norm(nn.gelu(self.mlm_dense(x), approximate=False))  # [B, S, E]
        return self.embed.attend(x) if self.config.tie_output else self.logits_dense(x)


class DecoderOnly(nn.Module, _OutputMixin):
    """Causal language model: logits [B, L, V] where position t sees targets[:t] only."""

    config: ModelConfig

    def setup(self):
        self.embed = _make_embed(self.config)
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
        decoder_inputs = shift_right(targets, self.config.bos_id, targets_segment_ids)
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


_MODELS = {
    "encoder_decoder": EncoderDecoder,
    "encoder_only": EncoderOnly,
    "decoder_only": DecoderOnly,
}


def create_model(config: ModelConfig) -> nn.Module:
    """The model class selected by `config.kind`, bound to `config`."""
    return _MODELS[config.kind](config)
