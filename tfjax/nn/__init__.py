"""Layers of the network: pure functions over arrays, and thin Flax modules around them.

Nothing here knows about configs, data or training; everything is usable on its own:

    from tfjax.nn import attention, masking, positional

Submodules: `masking` (boolean masks), `positional` (sinusoidal, learned, relative, rotary,
ALiBi), `attention` (score functions, masked softmax, `MultiHeadAttention`, local and cached
attention), `linear` (the dense layers' matmul), `norms` (LayerNorm, RMSNorm), `layers`
(feed-forward, embeddings, residual sub-layers), `stacking` (a stack's layers as a loop or one
scan, rematerialisation, the two parameter layouts), `losses` (label-smoothed cross-entropy
and metric sums), `prng` (dropout's random draws) and `fused` (the post-LN residual step as
one Pallas kernel). The encoder and decoder stacks of a `ModelConfig` are
`tfjax.models.transformer`.
"""

from tfjax import _lazy

__all__ = [
    "attention",
    "fused",
    "layers",
    "linear",
    "losses",
    "masking",
    "norms",
    "positional",
    "prng",
    "stacking",
]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
