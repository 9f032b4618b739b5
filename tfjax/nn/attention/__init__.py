"""Attention: score functions, the masked softmax, the KV cache and the multi-head attention module.

Submodules, one job each (each imports only those listed above it):
- `primitives`: `attention_logits` (the four scores), the input checks, probability dropout;
- `chunked`: `chunked_attention`, blocks of queries and keys with an online softmax, memory
  linear in the length forward and backward (masks, biases, causality, windows built per block);
- `core`: `masked_softmax`, `dot_product_attention` with its XLA / cuDNN / chunked / reference
  dispatch, and `Lengths`, a padding (and causal) mask given by lengths;
- `local`: blocked `local_attention` (|i - j| <= r in O(L · r)), `Window` (the restriction a
  model hands to `MultiHeadAttention`) and `window_attention`;
- `cache`: the head-major key/value cache of decoding: `cached_attention`, `append`;
- `projections`: head sizes, the q/k/v/out projections and the general/additive score weights;
- `module`: `MultiHeadAttention`, which wires the pieces above together.
The names below are re-exported: `from tfjax.nn import attention` is all most code needs.

Sources: scaled dot-product, multi-head, self- and cross-attention: Vaswani et al. 2017,
§3.2.1-3.2.3; dot and general (q^T W k) scores: Luong et al. 2015, §3.1; additive scores
v^T tanh(W_q q + W_k k): Bahdanau et al. 2015, Appendix A.1.2; multi-query and grouped-query
attention: Shazeer 2019, Ainslie et al. 2023 §2; online softmax: Rabe & Staats 2021,
FlashAttention; low-rank value: W_down [D, r] · W_up [r, K·H].

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
