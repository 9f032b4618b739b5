"""Marian (Junczys-Dowmunt et al. 2018; the OPUS-MT models) as tfjax's encoder-decoder.

What the Hugging Face `MarianMTModel` computes, in tfjax's options: one token table shared by the
source, the target and the output (`shared`, `share_encoder_decoder_embeddings`), scaled by
sqrt(d_model) when `scale_embedding`; fixed sinusoidal positions from 0 in both stacks with the
sines in the first half of the features and the cosines in the second
(`MarianSinusoidalPositionalEmbedding`, tfjax's `sinusoidal_layout="halves"`, frequencies
10000^(-2i/D) in both); post-LN layers (no final norm, no embedding norm) with `nn.LayerNorm`'s
epsilon 1e-5 (config.json has no epsilon: transformers hard-codes PyTorch's default); separate
q/k/v `Linear`s with biases (fused here into "qkv" [D, 3N, H] for self-attention and "kv"
[D, 2K, H] for cross-attention); an MLP `encoder_ffn_dim` wide with `activation_function`
("swish" = silu); tied logits plus `final_logits_bias` (`output_bias="on"`). The decoder starts
from `decoder_start_token_id` (the padding id).

Decoding as Hugging Face does it comes from the checkpoint's `generation_config.json`
(`decoding_options`): beam size, `length_penalty` (tfjax's `penalty="power"`), transformers'
early-stopping rule (`stopping="heuristic"`), single-token `bad_words_ids` (the padding id is
never generated) and `forced_eos_token_id`.

Not supported (a one-line error): separate source and target vocabularies
(`share_encoder_decoder_embeddings=false` or a `decoder_vocab_size` of its own), encoder and
decoder of different widths or head counts, activation dropout and layer drop, activations
other than swish/silu, gelu and relu, `MarianForCausalLM` checkpoints.
"""

import json
import pathlib

from tfjax import models
from tfjax.models import encoder_decoder
from tfjax.pretrained import checkpoint
from tfjax.pretrained.checkpoint import Entry

MODEL_TYPE = "marian"
PREFIX = "model."
PREFIXED_ARCHITECTURES = r"^MarianMTModel"  # MarianModel's weights have no prefix
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")  # its tokenizer's files
UNPREFIXED = ("lm_head.", "final_logits_bias")  # outside the "model." model
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}
UNSUPPORTED = {
    "share_encoder_decoder_embeddings": (True,),
    "tie_word_embeddings": (True,),
    "normalize_before": (False,),
    "activation_dropout": (0.0,),
    "encoder_layerdrop": (0.0,),
    "decoder_layerdrop": (0.0,),
    "is_decoder": (False,),
}
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which MarianEncoderLayer uses
GENERATION_FILE = "generation_config.json"


def _check_shapes(hf: dict) -> None:
    vocab, decoder_vocab = hf["vocab_size"], hf.get("decoder_vocab_size") or hf["vocab_size"]
    if decoder_vocab != vocab:
        raise checkpoint.ConversionError(
            f"config.json sets decoder_vocab_size={decoder_vocab} apart from vocab_size={vocab}: "
            "tfjax's Marian shares one vocabulary between source and target (convert a "
            "checkpoint with share_encoder_decoder_embeddings=true)"
        )
    for encoder, decoder in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf[encoder] != hf[decoder]:
            raise checkpoint.ConversionError(
                f"config.json sets {encoder}={hf[encoder]} but {decoder}={hf[decoder]}: tfjax's "
                "encoder and decoder share these sizes"
            )
    architectures = hf.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        raise checkpoint.ConversionError(
            f"config.json names architectures {architectures}: tfjax converts MarianMTModel "
            "(the translation model) only"
        )


def model_config(hf: dict, head: str | None = None) -> models.ModelConfig:
    """The `ModelConfig` of a Marian config.json (`head` must be None: Marian has one)."""
    checkpoint.check_options(hf, MODEL_TYPE, UNSUPPORTED, ACTIVATIONS, "activation_function")
    checkpoint.check_head(head, (None,), MODEL_TYPE)
    _check_shapes(hf)
    return models.ModelConfig(
        kind=encoder_decoder.KIND.name,
        vocab_size=hf["vocab_size"],
        embed_dim=hf["d_model"],
        num_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        num_heads=hf["encoder_attention_heads"],
        mlp_dim=hf["encoder_ffn_dim"],
        max_len=hf["max_position_embeddings"],
        dropout_rate=hf.get("dropout", 0.1),
        attention_dropout_rate=hf.get("attention_dropout", 0.0),
        positional="sinusoidal",
        sinusoidal_layout="halves",
        norm="layernorm",
        norm_position="post",
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        activation=ACTIVATIONS[hf["activation_function"]],
        use_bias=True,
        share_embeddings=True,
        tie_output=True,
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        output_bias="on",
        bos_id=hf["decoder_start_token_id"],
    )


def length_limit(directory, hf: dict) -> int:
    """The longest source and target the checkpoint reads: `max_position_embeddings` (512 for
    OPUS-MT), the rows of its sinusoid tables in transformers."""
    return hf["max_position_embeddings"]


def _attention(tf: str, hf: str, d: int, *, cross: bool) -> list[Entry]:
    """Rows of one attention block: q/k/v/out `Linear`s as tfjax's fused projections."""
    if cross:
        rows = [
            *checkpoint.dense(tf + "query", hf + "q_proj", d, d, "linear"),
            *checkpoint.fused(tf + "kv", (hf + "k_proj", hf + "v_proj"), d, d, bias=True),
        ]
    else:
        names = (hf + "q_proj", hf + "k_proj", hf + "v_proj")
        rows = checkpoint.fused(tf + "qkv", names, d, d, bias=True)
    return rows + checkpoint.dense(tf + "out", hf + "out_proj", d, d, "linear")


def _mlp(tf: str, hf: str, d: int, f: int) -> list[Entry]:
    return [
        *checkpoint.dense(tf + "mlp/wi", hf + "fc1", d, f, "linear"),
        *checkpoint.dense(tf + "mlp/wo", hf + "fc2", f, d, "linear"),
        *checkpoint.norm(tf + "mlp_residual/norm", hf + "final_layer_norm", d),
    ]


def table(cfg: models.ModelConfig) -> list[Entry]:
    """The weight table of `cfg` (names without the "model." prefix)."""
    d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
    rows = [
        Entry("embed/embedding", ("shared.weight",), ((v, d),)),
        Entry("logits_bias", ("final_logits_bias",), ((1, v),)),
    ]
    for i in range(cfg.num_layers):
        hf, tf = f"encoder.layers.{i}.", f"encoder/layer_{i}/"
        rows += [
            *_attention(tf + "self_attention/", hf + "self_attn.", d, cross=False),
            *checkpoint.norm(tf + "self_attention_residual/norm", hf + "self_attn_layer_norm", d),
            *_mlp(tf, hf, d, f),
        ]
    for i in range(cfg.num_decoder_layers):
        hf, tf = f"decoder.layers.{i}.", f"decoder/layer_{i}/"
        rows += [
            *_attention(tf + "self_attention/", hf + "self_attn.", d, cross=False),
            *checkpoint.norm(tf + "self_attention_residual/norm", hf + "self_attn_layer_norm", d),
            *_attention(tf + "cross_attention/", hf + "encoder_attn.", d, cross=True),
            *checkpoint.norm(
                tf + "cross_attention_residual/norm", hf + "encoder_attn_layer_norm", d
            ),
            *_mlp(tf, hf, d, f),
        ]
    return rows


# Copies of the shared table (checked equal, then dropped), and the fixed sinusoid tables
# (recomputed by both sides; transformers no longer saves them, older files hold them).
TIED = {
    "encoder.embed_tokens.weight": "shared.weight",
    "decoder.embed_tokens.weight": "shared.weight",
    "lm_head.weight": "shared.weight",
}
BUFFERS = (r"(en|de)coder\.embed_positions\.weight",)


def _check_search(path: pathlib.Path, early, bad_words: list, sample) -> None:
    """ConversionError naming the generation options tfjax's beam search cannot reproduce
    (only those: the others are fine)."""
    causes = [f"early_stopping={early!r}"] if early not in (False, None) else []
    multi = [words for words in bad_words if len(words) != 1]
    causes += [f"bad_words_ids with multi-token entries ({multi[:3]})"] if multi else []
    causes += [f"do_sample={sample!r}"] if sample else []
    if causes:
        raise checkpoint.ConversionError(
            f"{path}: {', '.join(causes)}: tfjax's beam search does not reproduce "
            f"{'this' if len(causes) == 1 else 'these'} (it does early_stopping=false, "
            "single-token bad words, no sampling)"
        )


def decoding_options(directory: str | pathlib.Path, hf: dict) -> dict:
    """How `generate` decodes this checkpoint, in tfjax's beam-search options.

    Read from `generation_config.json` when the directory has one, else from config.json:
    `beam_size` (num_beams), `alpha` (length_penalty) with `penalty="power"` and
    `stopping="heuristic"` (transformers' early_stopping=False), `forbidden_ids` (single-token
    bad_words_ids, the padding id for OPUS-MT), `force_eos` (forced_eos_token_id is the EOS id)
    and `max_length` (tfjax counts target positions, transformers the start token too: one
    less).

    Raises:
        tfjax.errors.ConversionError: for options tfjax's search cannot reproduce
            (early_stopping true or "never", multi-token bad words, sampling).
    """
    path = pathlib.Path(directory) / GENERATION_FILE
    generation = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    get = lambda key, default: generation.get(key, hf.get(key, default))  # noqa: E731
    bad_words = get("bad_words_ids", None) or []
    _check_search(path, get("early_stopping", False), bad_words, get("do_sample", False))
    eos = get("eos_token_id", 0)
    return {
        "beam_size": int(get("num_beams", 1)),
        "alpha": float(get("length_penalty", 1.0)),
        "penalty": "power",
        "stopping": "heuristic",
        "forbidden_ids": sorted({words[0] for words in bad_words} - {eos}),
        "force_eos": get("forced_eos_token_id", None) == eos,
        "max_length": int(get("max_length", 20)) - 1,
    }
