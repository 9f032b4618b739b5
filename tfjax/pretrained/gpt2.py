"""GPT-2 (Radford et al. 2019) as tfjax's decoder-only model: config and weight table.

What the Hugging Face `GPT2LMHeadModel` computes, in tfjax's options: learned positions
(`wpe`, `positional="learned"`, `max_len=n_positions`), unscaled token embeddings, pre-LN
layers with a final LayerNorm (`ln_f`), scaled dot-product attention with biases, a
tanh-approximated GELU (`gelu_new`) MLP 4 D wide, and logits tied to `wte`. The fused q/k/v
projection `c_attn` is a `Conv1D` whose weight is [in, out] = [D, 3D] (q, k, v, each head-major),
which is tfjax's fused "qkv" kernel [D, 3N, H] reshaped; `c_proj` [D, D] is "out" [N, H, D].
The decoder starts from `bos_token_id` (`<|endoftext|>`), as GPT-2 text is separated by it.
"""

from tfjax import models
from tfjax.models import decoder_only
from tfjax.pretrained import checkpoint
from tfjax.pretrained.checkpoint import Entry

MODEL_TYPE = "gpt2"
PREFIX = "transformer."  # GPT2LMHeadModel's; GPT2Model's weights have none
PREFIXED_ARCHITECTURES = r"^GPT2(LMHead|DoubleHeads)"  # architectures whose weights carry it
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")  # its tokenizer's files
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
ACTIVATIONS |= {"relu": "relu", "silu": "silu", "swish": "silu"}
# config.json options tfjax's model does not compute, with the values it does.
UNSUPPORTED = {
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
    "tie_word_embeddings": (True,),
}


def model_config(hf: dict, head: str | None = None) -> models.ModelConfig:
    """The `ModelConfig` of a GPT-2 config.json (`head` must be None: GPT-2 has one)."""
    checkpoint.check_options(hf, MODEL_TYPE, UNSUPPORTED, ACTIVATIONS, "activation_function")
    checkpoint.check_head(head, (None,), MODEL_TYPE)
    d = hf["n_embd"]
    return models.ModelConfig(
        kind=decoder_only.KIND.name,
        vocab_size=hf["vocab_size"],
        embed_dim=d,
        num_layers=hf["n_layer"],
        num_heads=hf["n_head"],
        mlp_dim=hf.get("n_inner") or 4 * d,
        max_len=hf["n_positions"],
        dropout_rate=hf.get("resid_pdrop", 0.1),
        attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        score="scaled_dot" if hf.get("scale_attn_weights", True) else "dot",
        positional="learned",
        norm="layernorm",
        norm_position="pre",
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
        activation=ACTIVATIONS[hf.get("activation_function", "gelu_new")],
        use_bias=True,
        tie_output=True,
        scale_embeddings=False,
        bos_id=hf.get("bos_token_id", 50256),
    )


def length_limit(directory, hf: dict) -> int:
    """The longest sequence the checkpoint reads: its position table's rows (`n_positions`)."""
    return hf["n_positions"]


def table(cfg: models.ModelConfig) -> list[Entry]:
    """The weight table of `cfg` (GPT2Model names, without the "transformer." prefix)."""
    d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
    rows = [
        Entry("embed/embedding", ("wte.weight",), ((v, d),)),
        Entry("decoder/embedder/pos_embedding/embedding", ("wpe.weight",), ((cfg.max_len, d),)),
        *checkpoint.norm("decoder/final_norm", "ln_f", d),
    ]
    for i in range(cfg.num_layers):
        hf, tf = f"h.{i}.", f"decoder/layer_{i}/"
        attention, mlp = tf + "self_attention/", tf + "mlp/"
        rows += [
            *checkpoint.norm(tf + "self_attention_residual/norm", hf + "ln_1", d),
            *checkpoint.dense(attention + "qkv", hf + "attn.c_attn", d, 3 * d, "kernel"),
            *checkpoint.dense(attention + "out", hf + "attn.c_proj", d, d, "kernel"),
            *checkpoint.norm(tf + "mlp_residual/norm", hf + "ln_2", d),
            *checkpoint.dense(mlp + "wi", hf + "mlp.c_fc", d, f, "kernel"),
            *checkpoint.dense(mlp + "wo", hf + "mlp.c_proj", f, d, "kernel"),
        ]
    return rows


# Copies of a tied tensor a file may hold (checked equal, then dropped), and buffers that are
# not parameters (the causal masks of transformers < 4.31).
TIED = {"lm_head.weight": "wte.weight"}
BUFFERS = (r"h\.\d+\.attn\.(masked_)?bias",)
