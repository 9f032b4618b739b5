"""Model FLOPs of one train step, counted from the parameter shapes (the MFU convention).

A weight of a dense layer costs 2 FLOPs per token forward (a multiply and an add) and 4 backward
(the gradients of its input and of itself): 6 per token that goes through it (Kaplan et al.
2020, "Scaling Laws for Neural Language Models", §2.1). Attention adds its two products per
layer, QKᵀ and PV, 2 · 2 · L · S · N · H forward and twice that backward (Chowdhery et al. 2022,
"PaLM", Appendix B). Counted here:
  * every `kernel` leaf, for the tokens of its stack: encoder B · S, decoder B · L (the
    cross-attention `kv` projection reads the encoder's B · S), and outside the stacks the
    output side (B · L for decoders, B · S for an MLM head, B for a classifier);
  * the token table once more when it is the tied output layer (V · D per output token);
  * not lookups (token, position and relative-bias tables), biases, norms, softmax or the
    optimizer update: the usual "model FLOPs" leave them out, so compiled FLOPs come out higher.
Full L x S products are counted even where a window or causal mask would allow skipping.
"""

import math
from typing import Any

import jax

from tfjax.models import config as config_lib
from tfjax.models import kinds


def _stack_tokens(path: tuple[str, ...], tokens: dict[str, int]) -> int:
    top = path[0]
    if top == "encoder":
        return tokens["source"]
    if top == "decoder":
        return tokens["source"] if "cross_attention" in path and "kv" in path else tokens["target"]
    return tokens["output"]


def train_flops(
    cfg: config_lib.ModelConfig, params: Any, *, batch: int, source_len: int, target_len: int
) -> float:
    """Model FLOPs of one train step (forward and backward) on a [B, S] / [B, L] batch.

    Args:
        cfg: the model's config.
        params: its parameter tree (arrays or `jax.ShapeDtypeStruct`s, e.g. from
            `jax.eval_shape`).
        batch: B, rows per step.
        source_len: S, the encoder's length (0 for decoder-only models).
        target_len: L, the decoder's length (0 for encoder-only models).

    Returns:
        FLOPs (see the module docstring for what counts).
    """
    counts = kinds.get(cfg.kind).counts(cfg, source_len, target_len)
    output = counts.output_tokens
    tokens = {"source": batch * source_len, "target": batch * target_len, "output": batch * output}
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(str(getattr(key, "key", key)) for key in path)
        if names[-1] == "kernel":
            total += 6 * math.prod(leaf.shape) * _stack_tokens(names, tokens)
    if cfg.tie_output and counts.vocab_output:
        total += 6 * cfg.vocab_size * cfg.token_width * tokens["output"]
    return float(total + 3 * _attention_flops(cfg, batch, counts.attention_pairs))


def _attention_flops(cfg: config_lib.ModelConfig, batch: int, pairs: int) -> int:
    """Forward FLOPs of QKᵀ and PV over every attention layer (`pairs`: `Counts`, per row)."""
    width = cfg.num_heads * (cfg.head_dim or cfg.embed_dim // cfg.num_heads)  # N · H
    return 4 * batch * pairs * width
