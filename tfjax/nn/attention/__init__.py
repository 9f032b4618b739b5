"""Attention: score functions, the masked softmax, the KV cache and the multi-head attention module.

Submodules, one job each (each imports only those listed above it):
- `primitives`: what every path shares: `attention_logits` (the four scores), the input checks
  and probability dropout (re-exported by `core`);
- `chunked`: `chunked_attention`, queries and keys in blocks with an online softmax (Rabe &
  Staats 2021; FlashAttention), memory linear in the length in the forward and backward passes,
  with dense masks and biases read per block and causality, windows, segment ids and offset
  biases (T5 relative, ALiBi) built per block;
- `core`: pure attention math: `masked_softmax` and `dot_product_attention` with its XLA /
  cuDNN / chunked / reference dispatch, and `Lengths`, a padding (and causal) mask given by
  lengths, which cuDNN applies in its kernel;
- `local`: blocked `local_attention`, |i - j| <= r in O(L · r), with segment ids, causality,
  dropout and offset biases (T5 relative, ALiBi); `Window`, the restriction a model hands to
  `MultiHeadAttention(..., window=...)` (radius None: only causality, segments and the offset
  bias, for the chunked path), and `window_attention`: chunked, blocked or dense fallback;
- `cache`: the head-major key/value cache of decoding: `cached_attention` over it, the pure
  `append`, and the reads/writes of a module's "cache" collection;
- `projections`: head sizes, the q/k/v/out projections (fused QKV, separate q, k, v, cross kv,
  low-rank value) and the general/additive score weights;
- `module`: `MultiHeadAttention`, which wires the pieces above together.
The names below are re-exported, so `from tfjax.nn import attention` then
`attention.dot_product_attention(...)` or `attention.MultiHeadAttention(...)` is all most code
needs.

Sources:
- scaled dot-product and multi-head attention: Vaswani et al. 2017, "Attention Is All You Need",
  §3.2.1 (Eq. 1) and §3.2.2; self- and cross-attention (encoder-decoder attention): §3.2.3;
- plain dot and general (bilinear, q^T W k) scores: Luong et al. 2015, §3.1;
- additive scores, v^T tanh(W_q q + W_k k): Bahdanau et al. 2015, Appendix A.1.2;
- multi-query and grouped-query attention: Shazeer 2019; Ainslie et al. 2023 (GQA), §2;
- low-rank value projection: the value matrix factorised as W_down [D, r] · W_up [r, K·H];
- key/value cache for autoregressive decoding (flax "cache" collection): self-attention keys and
  values are written one step at a time, encoder keys/values are projected once per source.

Axis letters: B batch, L query length, S key length, D model width, N query heads, K key/value
heads, G = N // K queries per kv head, H head width, A additive-score width.
Masks are boolean (True = may attend) and broadcast to [B, N, L, S]; they are applied once, in
`dot_product_attention` (or `cached_attention`), with float32 logits and a finite large
negative; fully masked query rows return zeros.
"""

from tfjax.nn.attention.cache import cached_attention
from tfjax.nn.attention.chunked import chunked_attention
from tfjax.nn.attention.core import (
    IMPLEMENTATIONS,
    SCORES,
    Lengths,
    attention_logits,
    attention_weights,
    dot_product_attention,
    masked_softmax,
)
from tfjax.nn.attention.local import Window, local_attention, window_attention
from tfjax.nn.attention.module import MultiHeadAttention

__all__ = [
    "IMPLEMENTATIONS",
    "SCORES",
    "Lengths",
    "MultiHeadAttention",
    "Window",
    "attention_logits",
    "attention_weights",
    "cached_attention",
    "chunked_attention",
    "dot_product_attention",
    "local_attention",
    "masked_softmax",
    "window_attention",
]
