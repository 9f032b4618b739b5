"""T5 (Raffel et al. 2020) v1.0 and v1.1 as tfjax's encoder-decoder model: config and weight table.

What the Hugging Face `T5ForConditionalGeneration` computes, in tfjax's options: no absolute
positions, unscaled token embeddings (`shared`, used by encoder, decoder and, when tied, the
output), pre-LN layers with RMSNorm without bias (variance in float32) and a final norm in each
stack, attention logits without the 1/sqrt(H) scale (`score="dot"`) plus a relative position
bias (`positional="relative"`, T5's buckets) learned in the first layer of each stack and shared
by all its layers (none in cross-attention), heads of width `d_kv` (`head_dim`, which need not
be D / N), no biases anywhere. The separate q/k/v `Linear`s [N H, D] are fused into tfjax's "qkv"
kernel [D, 3N, H] (k and v into "kv" in cross-attention). Dropout (`dropout_rate`) sits where
T5 puts it: on the embeddings, on the attention probabilities, on each sub-layer's output, on
the feed-forward's hidden activations (`mlp_dropout`) and after each stack's final norm
(`final_dropout`).

The two versions differ in the feed-forward and the output:
- v1.0 (`feed_forward_proj="relu"`): ReLU, and logits tied to `shared`, the decoder output
  multiplied by d_model**-0.5 first (`rescale_output`);
- v1.1, FLAN-T5 (`"gated-gelu"`: tanh-GELU gate, tfjax's "geglu_tanh"; `"gated-silu"`:
  "swiglu"), `tie_word_embeddings=false`: an untied `lm_head` and no rescaling.
transformers >= 5 always ties in its config and writes the rescaling as
`scale_decoder_outputs`; a checkpoint is untied when its `lm_head.weight` differs from `shared`
or config.json says `tie_word_embeddings=false` (see `model_config` and `tied`).

The decoder starts from `decoder_start_token_id` (the padding id 0); the tokenizer (T5's
SentencePiece model) appends EOS `</s>` to sources and targets, as tfjax's pipeline does.
"""

import json
import pathlib

from tfjax import models
from tfjax.models import encoder_decoder
from tfjax.pretrained import checkpoint
from tfjax.pretrained.checkpoint import Entry

MODEL_TYPE = "t5"
PREFIX = ""  # T5's weights carry no prefix
PREFIXED_ARCHITECTURES = r"(?!)"  # matches nothing
TOKENIZER_FILES = ("spiece.model", "tokenizer.json")  # its tokenizer's files
FEED_FORWARD = {"relu": "relu", "gated-gelu": "geglu_tanh", "gated-silu": "swiglu"}
ARCHITECTURES = ("T5ForConditionalGeneration", "T5Model")
UNSUPPORTED = {"is_decoder": (False,), "add_cross_attention": (False,)}


def _check(hf: dict, head: str | None) -> None:
    with_default = {"feed_forward_proj": "relu", **hf}  # absent from older config.json files
    checkpoint.check_options(
        with_default, MODEL_TYPE, UNSUPPORTED, FEED_FORWARD, "feed_forward_proj"
    )
    checkpoint.check_head(head, (None,), MODEL_TYPE)
    architectures = hf.get("architectures") or ["T5ForConditionalGeneration"]
    if not any(a in ARCHITECTURES for a in architectures):
        raise checkpoint.ConversionError(
            f"config.json names architectures {architectures}: tfjax converts "
            f"{', '.join(ARCHITECTURES)} (a sequence-to-sequence model with its decoder)"
        )


def untied(hf: dict) -> bool:
    """Whether the output layer is `lm_head` rather than `shared` (v1.1, FLAN-T5).

    config.json says so with `tie_word_embeddings=false` (transformers < 5, the Hub's v1.1
    files) or, as transformers >= 5 writes it, with `scale_decoder_outputs=false` (it always
    writes `tie_word_embeddings=true` and keeps a different `lm_head.weight` untied).
    """
    return hf.get("tie_word_embeddings", True) is False or hf.get("scale_decoder_outputs") is False


def model_config(hf: dict, head: str | None = None) -> models.ModelConfig:
    """The `ModelConfig` of a T5 config.json (`head` must be None: T5 has one)."""
    _check(hf, head)
    rate = hf.get("dropout_rate", 0.1)
    return models.ModelConfig(
        kind=encoder_decoder.KIND.name,
        vocab_size=hf["vocab_size"],
        embed_dim=hf["d_model"],
        num_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        num_heads=hf["num_heads"],
        head_dim=hf.get("d_kv", 64),
        mlp_dim=hf["d_ff"],
        max_len=hf.get("n_positions", 512),  # no position table: only a nominal length
        dropout_rate=rate,
        attention_dropout_rate=rate,
        mlp_dropout=True,
        final_dropout=True,
        score="dot",
        positional="relative",
        relative_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128),
        norm="rmsnorm",
        norm_position="pre",
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
        activation=FEED_FORWARD[hf.get("feed_forward_proj", "relu")],
        use_bias=False,
        share_embeddings=True,
        tie_output=not untied(hf),
        rescale_output=not untied(hf),
        output_bias="off",
        scale_embeddings=False,
        bos_id=_start_id(hf),
    )


# T5's relative positions have no longest sequence: the one its tokenizer and the paper's
# pre-training use when the tokenizer names none (`length_limit`).
DEFAULT_LENGTH = 512
TOKENIZER_CONFIG = "tokenizer_config.json"


def length_limit(directory: str | pathlib.Path, hf: dict) -> int:
    """The longest source and target to read: the tokenizer's `model_max_length` (512 for the
    Hub's T5 and FLAN-T5), else `DEFAULT_LENGTH` (relative positions set no limit; an unset
    `model_max_length` is transformers' 1e30 placeholder)."""
    path = pathlib.Path(directory) / TOKENIZER_CONFIG
    try:
        length = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    except (OSError, ValueError, AttributeError):  # absent or unreadable: the default
        length = None
    valid = isinstance(length, int) and 0 < length < 10**6
    return length if valid else DEFAULT_LENGTH


def _start_id(hf: dict) -> int:
    start = hf.get("decoder_start_token_id")
    return hf.get("pad_token_id", 0) if start is None else start


def _attention(tf: str, hf: str, d: int, inner: int, *, cross: bool) -> list[Entry]:
    """Rows of one T5Attention `hf` (q, k, v, o [out, in], no biases) as tfjax's `tf`."""
    if cross:
        rows = [
            *checkpoint.dense(tf + "query", hf + "q", d, inner, "linear", bias=False),
            *checkpoint.fused(tf + "kv", (hf + "k", hf + "v"), d, inner, bias=False),
        ]
    else:
        rows = checkpoint.fused(tf + "qkv", (hf + n for n in "qkv"), d, inner, bias=False)
    return rows + checkpoint.dense(tf + "out", hf + "o", inner, d, "linear", bias=False)


def _mlp(tf: str, hf: str, cfg: models.ModelConfig) -> list[Entry]:
    """Rows of T5LayerFF's `DenseReluDense` (gated: act(wi_0 x) * (wi_1 x), tfjax's wi_gate
    and wi)."""
    d, f = cfg.embed_dim, cfg.mlp_dim
    dense = lambda path, name, d_in, d_out: checkpoint.dense(  # noqa: E731
        tf + path, hf + name, d_in, d_out, "linear", bias=False
    )
    if cfg.activation in ("geglu_tanh", "swiglu"):
        rows = [*dense("wi_gate", "wi_0", d, f), *dense("wi", "wi_1", d, f)]
    else:
        rows = dense("wi", "wi", d, f)
    return rows + dense("wo", "wo", f, d)


def _layer(tf: str, hf: str, cfg: models.ModelConfig, *, decoder: bool) -> list[Entry]:
    """Rows of one T5Block `hf` ("...block.i.layer."): self-attention, cross-attention (decoder),
    feed-forward, each with its RMSNorm (scale only)."""
    d, inner = cfg.embed_dim, cfg.num_heads * cfg.head_dim
    norm = lambda path, name: checkpoint.norm(tf + path, hf + name, d, bias=False)  # noqa: E731
    mlp = "2." if decoder else "1."
    rows = [
        *norm("self_attention_residual/norm", "0.layer_norm"),
        *_attention(tf + "self_attention/", hf + "0.SelfAttention.", d, inner, cross=False),
        *norm("mlp_residual/norm", mlp + "layer_norm"),
        *_mlp(tf + "mlp/", hf + mlp + "DenseReluDense.", cfg),
    ]
    if decoder:
        rows += [
            *norm("cross_attention_residual/norm", "1.layer_norm"),
            *_attention(tf + "cross_attention/", hf + "1.EncDecAttention.", d, inner, cross=True),
        ]
    return rows


def _stack(stack: str, cfg: models.ModelConfig, num_layers: int) -> list[Entry]:
    """Rows of `encoder` or `decoder`: its relative bias (first block), layers, final norm."""
    bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    shape = (cfg.relative_num_buckets, cfg.num_heads)
    final = checkpoint.norm(
        f"{stack}/final_norm", f"{stack}.final_layer_norm", cfg.embed_dim, bias=False
    )
    rows = [Entry(f"{stack}/relative_bias/rel_embedding", (bias,), (shape,)), *final]
    for i in range(num_layers):
        hf, tf = f"{stack}.block.{i}.layer.", f"{stack}/layer_{i}/"
        rows += _layer(tf, hf, cfg, decoder=stack == "decoder")
    return rows


def table(cfg: models.ModelConfig) -> list[Entry]:
    """The weight table of `cfg` (T5ForConditionalGeneration's names)."""
    d, v = cfg.embed_dim, cfg.vocab_size
    rows = [Entry("embed/embedding", ("shared.weight",), ((v, d),))]
    if not cfg.tie_output:
        rows += checkpoint.dense("logits_dense", "lm_head", d, v, "linear", bias=False)
    rows += _stack("encoder", cfg, cfg.num_layers)
    return rows + _stack("decoder", cfg, cfg.num_decoder_layers)


# Copies of the shared table the encoder and decoder (and a tied lm_head) keep: checked equal to
# it, then dropped. transformers ignores a cross-attention bias of older files: so does tfjax.
TIED = {
    "encoder.embed_tokens.weight": "shared.weight",
    "decoder.embed_tokens.weight": "shared.weight",
}
BUFFERS = (r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",)


def tied(config: models.ModelConfig) -> dict[str, str]:
    """`TIED`, and the output layer when it is `shared` (v1.0)."""
    return {**TIED, "lm_head.weight": "shared.weight"} if config.tie_output else dict(TIED)
