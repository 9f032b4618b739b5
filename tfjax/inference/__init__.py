"""Decoding and scoring: KV-cached greedy and sampled generation, beam search, metrics.

Imports `tfjax.nn`, `tfjax.models` and `tfjax.data` only; the training loop and the
workdir tools (`tfjax.runs`) build on it.
"""

from tfjax import _lazy

__all__ = ["attention_maps", "beam_search", "decoding", "evaluation"]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
