"""`ModelConfig`: every model's hyperparameters, validated on construction, and the presets.

Defaults are the base model of Vaswani et al. 2017 (Table 3); `preset("big")` is the big one.
`ModelConfig` is built as `ModelConfig(**config.model)` from an ml_collections config and is
frozen. The models that read it are in `encoder_decoder`, `encoder_only` and `decoder_only`;
`kind` names one of them (`tfjax.models.kinds`).
"""

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from tfjax import errors
from tfjax.models import kinds
from tfjax.nn import attention, layers, norms, positional, stacking

POSITIONALS = ("sinusoidal", "learned", "relative", "rotary", "alibi", "none")
ENCODER_HEADS = ("classify", "mlm")
OUTPUT_BIASES = ("auto", "on", "off")
DTYPES = ("float32", "bfloat16", "float16")
PARAMETRIZATIONS = ("standard", "mup")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of every model; defaults are the paper's base model (Vaswani Table 3).

    Sizes: `embed_dim` D, `num_layers` (encoder, or the only stack of the decoder-only model),
    `num_decoder_layers` (decoder of the encoder-decoder),
    `num_heads` N, `num_kv_heads` K (0 = N), `head_dim` H (0 = D // N), `mlp_dim` F,
    `max_len` (longest position for learned tables), `vocab_size` V (shared by source and target).
    Options name one of the module-level tuples (`POSITIONALS`, `attention.SCORES`, ...);
    `window_radius` r > 0 restricts self-attention to |i - j| <= r (blocked, O(L · r), outside
    cached decoding; see `attention.local`); `value_rank` r > 0 factorises the value projection;
    `positional_dim` is the position width when positions are concatenated.
    `attention_impl` names one of `attention.IMPLEMENTATIONS`: "chunked" runs every attention
    in blocks with an online softmax (`attention.chunked`), its memory linear in the length;
    with "cudnn" the masks of rows given without positions (unpacked: one sequence each,
    padded at its end) go to cuDNN as lengths (`attention.Lengths`), so pass positions with
    packed rows (the data pipeline does).
    `residual_impl="pallas"` runs each post-LN residual step LayerNorm(x + dropout(y)) as one
    fused Pallas kernel each way (`tfjax.nn.fused`; Triton on NVIDIA GPUs, interpreted
    elsewhere), with hash-based dropout masks; "xla" (default) leaves it to XLA.
    `dtype` is the compute dtype and `param_dtype` the storage dtype (names as strings).
    `scan_layers` runs each stack as one `nn.scan` (parameters stacked on a leading layer axis,
    compile time independent of depth; `stacking.stack_layers` converts parameter trees);
    `remat` names the rematerialisation policy of every layer (`stacking.REMAT_POLICIES`).
    Neither changes the numbers the model computes.
    `parametrization="mup"` is the Maximal Update Parametrization for a model `embed_dim` wide
    whose learning rates were tuned at `base_width` (`tfjax.models.mup`: readout, attention and
    token-table multipliers; `tfjax.training.mup`: the hidden matrices' Adam learning rates);
    at embed_dim == base_width it is the standard model. `base_width` is unused otherwise.

    Options pretrained checkpoints need (`tfjax.pretrained`), each off by default:
    `num_token_types` > 0 adds a learned table of token types (segments A/B, BERT §3.2; type 0
    unless the inputs give `inputs_token_types`) to the embeddings; `embedding_norm` normalises
    the sum of embeddings and positions before dropout (BERT); `output_bias` is "on" for a
    learned [V] bias on the logits (tied ones too: BERT's MLM bias, Marian's
    `final_logits_bias`), "off" for none, "auto" for the untied output layer's own bias only.
    T5 (Raffel et al. 2020; Mesh TensorFlow) adds: `mlp_dropout` applies `dropout_rate` to the
    feed-forward's hidden activations too; `final_dropout` applies it after each stack's final
    norm (encoder output and decoder output); `rescale_output` multiplies the decoder output
    by D**-0.5 before the output layer (T5 v1.0, whose logits are tied to unscaled embeddings).
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
    dropout_rate: float | jax.Array = 0.1  # an Array: traced per trial (vectorised sweeps)
    attention_dropout_rate: float | jax.Array = 0.0  # an Array: traced, as dropout_rate
    score: str = "scaled_dot"
    attention_impl: str = "auto"
    residual_impl: str = "xla"
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
    num_token_types: int = 0
    embedding_norm: bool = False
    output_bias: str = "auto"
    mlp_dropout: bool = False
    final_dropout: bool = False
    rescale_output: bool = False
    encoder_head: str = "classify"
    num_classes: int = 2
    bos_id: int = 1
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    parametrization: str = "standard"
    base_width: int = 0

    def __post_init__(self):
        _check_choices(self)
        _check_sizes(self)
        _check_cudnn(self)
        _check_fused_residual(self)
        _check_mup(self)

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
    def has_output_bias(self) -> bool:
        """Whether the logits get a learned [V] bias (`output_bias`; "auto": untied only)."""
        return self.output_bias == "on" or (self.output_bias == "auto" and not self.tie_output)

    @property
    def use_final_norm(self) -> bool:
        """Pre-LN stacks always end with a norm; post-LN ones only when asked (PyTorch has one)."""
        return self.final_norm or self.norm_position == "pre"


_CHOICES = {
    "positional": POSITIONALS,
    "positional_combine": positional.COMBINE_MODES,
    "sinusoidal_layout": positional.SINUSOIDAL_LAYOUTS,
    "score": attention.SCORES,
    "attention_impl": attention.IMPLEMENTATIONS,
    "residual_impl": layers.RESIDUAL_IMPLS,
    "norm": norms.NORMS,
    "norm_position": layers.NORM_POSITIONS,
    "activation": layers.ACTIVATIONS,
    "encoder_head": ENCODER_HEADS,
    "output_bias": OUTPUT_BIASES,
    "dtype": DTYPES,
    "param_dtype": DTYPES,
    "remat": stacking.REMAT_POLICIES,
    "parametrization": PARAMETRIZATIONS,
}


def _check_choices(cfg: ModelConfig) -> None:
    for field, allowed in {"kind": kinds.names(), **_CHOICES}.items():
        if getattr(cfg, field) not in allowed:
            raise errors.ConfigError(
                f"ModelConfig.{field}={getattr(cfg, field)!r} is not one of {allowed}"
            )


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
    _refuse("attention_impl='cudnn'", problems, "attention_impl='auto'")


def _check_fused_residual(cfg: ModelConfig) -> None:
    """residual_impl="pallas" fuses the post-LN LayerNorm step (`tfjax.nn.fused`) only."""
    if cfg.residual_impl != "pallas":
        return
    problems = []
    if cfg.norm_position != "post":
        problems.append(f"norm_position={cfg.norm_position!r} (it fuses post-LN)")
    if cfg.norm != "layernorm":
        problems.append(f"norm={cfg.norm!r} (it fuses LayerNorm)")
    _refuse("residual_impl='pallas'", problems, "residual_impl='xla'")


def _check_mup(cfg: ModelConfig) -> None:
    """parametrization="mup" needs the proxy's width and a dot-product score."""
    if cfg.parametrization != "mup":
        return
    problems = []
    if not (isinstance(cfg.base_width, numbers.Integral) and cfg.base_width > 0):
        problems.append(f"base_width={cfg.base_width!r} (set the tuned proxy's embed_dim)")
    if cfg.score not in ("scaled_dot", "dot"):
        problems.append(f"score={cfg.score!r} (μP scales the dot scores' logits)")
    _refuse("parametrization='mup'", problems, "parametrization='standard'")


def _refuse(option: str, problems: list[str], instead: str) -> None:
    """One ConfigError naming every setting that `option` cannot run with, if any."""
    if problems:
        raise errors.ConfigError(
            f"ModelConfig.{option} cannot run with " + ", ".join(problems) + f"; or use {instead}"
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
            raise errors.ConfigError(f"ModelConfig.{field} must be > 0, got {getattr(cfg, field)}")
    for field in ("vocab_size", "num_classes"):
        if getattr(cfg, field) < 2:
            raise errors.ConfigError(
                f"ModelConfig.{field} must be >= 2, got {getattr(cfg, field)}: a softmax over "
                "one class is always certain (a yes/no label is num_classes=2)"
            )
    for field in (
        "num_decoder_layers",
        "num_kv_heads",
        "head_dim",
        "value_rank",
        "window_radius",
        "positional_dim",
        "num_token_types",
    ):
        if getattr(cfg, field) < 0:
            raise errors.ConfigError(f"ModelConfig.{field} must be >= 0, got {getattr(cfg, field)}")
    if not cfg.head_dim and cfg.embed_dim % cfg.num_heads:
        raise errors.ConfigError(
            f"ModelConfig.embed_dim={cfg.embed_dim} must be divisible by num_heads="
            f"{cfg.num_heads} (or set head_dim)"
        )
    if cfg.num_kv_heads and cfg.num_heads % cfg.num_kv_heads:
        raise errors.ConfigError(
            f"ModelConfig.num_heads={cfg.num_heads} must be divisible by num_kv_heads="
            f"{cfg.num_kv_heads}"
        )
    for field in ("dropout_rate", "attention_dropout_rate"):
        if not isinstance(getattr(cfg, field), numbers.Real):
            continue  # traced: a vectorised sweep's trial, checked before tracing
        if not 0.0 <= getattr(cfg, field) < 1.0:
            raise errors.ConfigError(
                f"ModelConfig.{field} must be in [0, 1), got {getattr(cfg, field)}"
            )
    _check_positions(cfg)


def _check_positions(cfg: ModelConfig) -> None:
    if cfg.positional_combine != "concat":
        return
    if cfg.positional not in ("sinusoidal", "learned"):
        raise errors.ConfigError(
            f"ModelConfig.positional_combine='concat' needs positional in ('sinusoidal', "
            f"'learned'), got {cfg.positional!r}"
        )
    if not 0 < cfg.positional_dim < cfg.embed_dim or cfg.positional_dim % 2:
        raise errors.ConfigError(
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
        raise errors.ConfigError(f"preset {name!r} is not one of {tuple(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
