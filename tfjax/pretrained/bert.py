"""BERT (Devlin et al. 2019) as tfjax's encoder-only model: config and weight table.

What `BertForMaskedLM` and `BertForSequenceClassification` compute, in tfjax's options: word,
learned position and token-type embeddings (`num_token_types`), summed and normalised
(`embedding_norm`), post-LN layers with exact GELU, separate q/k/v `Linear`s (fused here into
one "qkv" kernel [D, 3N, H]), LayerNorm epsilon 1e-12. The MLM head is dense + GELU +
LayerNorm, then the word embeddings (tied) plus a learned bias (`output_bias="on"`); the
classification head is the pooler (tanh of a dense layer on [CLS]) and a classifier, as
tfjax's "classify" head. The tokenizer's [CLS] is its BOS and [SEP] its EOS, so
classification inputs read "[CLS] text" (no trailing [SEP]).

`BertForPreTraining` checkpoints (what `bert-base-uncased` is) load as the MLM model: their
masked-LM head is `BertForMaskedLM`'s, and the tensors of the next-sentence head
(`cls.seq_relationship.*`) and of the pooler that feeds it (`bert.pooler.dense.*`) are dropped
by name (`unused`, with a one-line warning); any other unknown tensor is still refused. Such a
model exports as `BertForMaskedLM` (`export_config`, also with a warning).

Not supported (a one-line error): relative position embeddings, decoder use, activations other
than exact GELU, and classifiers transformers trains with another loss than tfjax's softmax
cross-entropy (`problem_type` "multi_label_classification" or "regression", or one label).
"""

import logging

from tfjax import models
from tfjax.models import encoder_only
from tfjax.pretrained import checkpoint
from tfjax.pretrained.checkpoint import Entry

MODEL_TYPE = "bert"
PREFIX = "bert."
PREFIXED_ARCHITECTURES = r"^BertFor"  # BertModel's weights have no prefix
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # its tokenizer's files
UNPREFIXED = ("cls.", "classifier.")  # head tensors, outside the "bert." model
ACTIVATIONS = {"gelu": "gelu"}  # the MLM head's GELU is exact, as tfjax's
UNSUPPORTED = {
    "position_embedding_type": ("absolute",),
    "is_decoder": (False,),
    "add_cross_attention": (False,),
    "tie_word_embeddings": (True,),
}
SINGLE_LABEL = "single_label_classification"  # the problem_type tfjax's classify head trains
# transformers' losses by problem_type (BertForSequenceClassification).
LOSSES = {
    SINGLE_LABEL: "softmax cross-entropy",
    "multi_label_classification": "a sigmoid cross-entropy per label",
    "regression": "mean squared error",
}
HEADS = {
    "BertForMaskedLM": "mlm",
    "BertForSequenceClassification": "classify",
    "BertForPreTraining": "mlm",  # its next-sentence head is dropped (`unused`)
}
# Tensors of a BertForPreTraining the MLM model has no place for, dropped by name, and why.
PRETRAINING_ONLY = {
    "cls.seq_relationship.weight": "the next-sentence head",
    "cls.seq_relationship.bias": "the next-sentence head",
    "pooler.dense.weight": "the pooler, which only the next-sentence head reads",
    "pooler.dense.bias": "the pooler, which only the next-sentence head reads",
}

log = logging.getLogger(__name__)


def _head(hf: dict, head: str | None) -> str:
    architectures = hf.get("architectures") or []
    named = [HEADS[a] for a in architectures if a in HEADS]
    if head is None and not named:
        raise checkpoint.ConversionError(
            f"config.json names architectures {architectures}: tfjax converts "
            f"{', '.join(HEADS)} (or pass head='mlm' / 'classify' for a BertModel)"
        )
    return head or named[0]


def _check_problem_type(hf: dict) -> None:
    """ConversionError unless the classifier is trained as tfjax trains it: one label per
    example, softmax cross-entropy over >= 2 classes.

    transformers picks the loss by `problem_type`: "single_label_classification" (softmax),
    "multi_label_classification" (a sigmoid per label) or "regression" (mean squared error);
    unset, one label means regression. tfjax's classification head computes the first only,
    so the others would fine-tune with another loss than the checkpoint's.
    """
    labels = len(hf.get("id2label") or {0: 0, 1: 1})
    problem = hf.get("problem_type") or ("regression" if labels == 1 else SINGLE_LABEL)
    if problem not in LOSSES:
        raise checkpoint.ConversionError(
            f"config.json sets problem_type={problem!r}, which transformers does not know "
            f"(it knows {', '.join(LOSSES)})"
        )
    if problem != SINGLE_LABEL:
        raise checkpoint.ConversionError(
            f"config.json's classifier is a {problem} model (problem_type="
            f"{hf.get('problem_type')!r}, {labels} labels), which transformers trains with "
            f"{LOSSES[problem]}: tfjax's classify head trains {SINGLE_LABEL} only (softmax "
            "cross-entropy, one of >= 2 labels per example); convert a single-label classifier"
        )


def model_config(hf: dict, head: str | None = None) -> models.ModelConfig:
    """The `ModelConfig` of a BERT config.json; `head` "mlm" or "classify" (None: its own)."""
    checkpoint.check_options(hf, MODEL_TYPE, UNSUPPORTED, ACTIVATIONS, "hidden_act")
    head = _head(hf, head)
    checkpoint.check_head(head, ("mlm", "classify"), MODEL_TYPE)
    if head == "classify":
        _check_problem_type(hf)
    return models.ModelConfig(
        kind=encoder_only.KIND.name,
        encoder_head=head,
        num_classes=len(hf.get("id2label") or {0: 0, 1: 1}),
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        mlp_dim=hf["intermediate_size"],
        max_len=hf["max_position_embeddings"],
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        positional="learned",
        norm="layernorm",
        norm_position="post",
        layer_norm_epsilon=hf.get("layer_norm_eps", 1e-12),
        activation=ACTIVATIONS[hf["hidden_act"]],
        use_bias=True,
        tie_output=True,
        scale_embeddings=False,
        num_token_types=hf.get("type_vocab_size", 2),
        embedding_norm=True,
        output_bias="on" if head == "mlm" else "auto",
    )


def length_limit(directory, hf: dict) -> int:
    """The longest input the checkpoint reads: its position table's rows."""
    return hf["max_position_embeddings"]


def table(cfg: models.ModelConfig) -> list[Entry]:
    """The weight table of `cfg` (names without the "bert." prefix)."""
    d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
    embedder = "encoder/embedder/"
    rows = [
        Entry("embed/embedding", ("embeddings.word_embeddings.weight",), ((v, d),)),
        Entry(
            embedder + "pos_embedding/embedding",
            ("embeddings.position_embeddings.weight",),
            ((cfg.max_len, d),),
        ),
        Entry(
            embedder + "token_type_embedding",
            ("embeddings.token_type_embeddings.weight",),
            ((cfg.num_token_types, d),),
        ),
        *checkpoint.norm(embedder + "norm", "embeddings.LayerNorm", d),
    ]
    for i in range(cfg.num_layers):
        hf, tf = f"encoder.layer.{i}.", f"encoder/layer_{i}/"
        qkv = [hf + "attention.self." + name for name in ("query", "key", "value")]
        out, out_norm = hf + "attention.output.dense", hf + "attention.output.LayerNorm"
        rows += [
            *checkpoint.fused(tf + "self_attention/qkv", qkv, d, d, bias=True),
            *checkpoint.dense(tf + "self_attention/out", out, d, d, "linear"),
            *checkpoint.norm(tf + "self_attention_residual/norm", out_norm, d),
            *checkpoint.dense(tf + "mlp/wi", hf + "intermediate.dense", d, f, "linear"),
            *checkpoint.dense(tf + "mlp/wo", hf + "output.dense", f, d, "linear"),
            *checkpoint.norm(tf + "mlp_residual/norm", hf + "output.LayerNorm", d),
        ]
    if cfg.encoder_head == "mlm":
        rows += [
            *checkpoint.dense("mlm_dense", "cls.predictions.transform.dense", d, d, "linear"),
            *checkpoint.norm("mlm_norm", "cls.predictions.transform.LayerNorm", d),
            Entry("logits_bias", ("cls.predictions.bias",), ((v,),)),
        ]
    else:
        rows += [
            *checkpoint.dense("pooler", "pooler.dense", d, d, "linear"),
            *checkpoint.dense("classifier", "classifier", d, cfg.num_classes, "linear"),
        ]
    return rows


def rename(name: str) -> str:
    """Older checkpoints' LayerNorm "gamma" / "beta" are today's "weight" / "bias"."""
    if name.endswith("LayerNorm.gamma"):
        return name.removesuffix("gamma") + "weight"
    if name.endswith("LayerNorm.beta"):
        return name.removesuffix("beta") + "bias"
    return name


def unused(cfg: models.ModelConfig) -> dict[str, str]:
    """Tensor names (without the "bert." prefix) the model of `cfg` drops, with the reason:
    the MLM model drops BertForPreTraining's next-sentence head and pooler."""
    return PRETRAINING_ONLY if cfg.encoder_head == "mlm" else {}


def export_config(hf: dict, cfg: models.ModelConfig) -> dict:
    """The config.json to export `cfg` with: a BertForPreTraining becomes a BertForMaskedLM,
    the model tfjax holds (its next-sentence head was dropped on import)."""
    if cfg.encoder_head != "mlm" or "BertForPreTraining" not in (hf.get("architectures") or []):
        return hf
    log.warning(
        "exporting as BertForMaskedLM, not BertForPreTraining: the next-sentence head was "
        "dropped when the checkpoint was imported"
    )
    return {**hf, "architectures": ["BertForMaskedLM"]}


TIED = {
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
BUFFERS = (r"embeddings\.position_ids",)
