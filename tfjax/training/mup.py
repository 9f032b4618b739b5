"""μP's per-parameter Adam learning-rate multipliers (`ModelConfig.parametrization="mup"`).

Source: Yang, Hu et al. 2022, "Tensor Programs V" (arXiv 2203.03466), Table 3, μP for Adam:
with width multiplier m = embed_dim / base_width, the hidden layers' matrices (both fans grow
with the width: attention projections, feed-forward kernels, the classifier's pooler and the
masked-LM head's dense) take learning rate η / m; every other parameter, the vector-like ones
(biases, norm scales), the embeddings (token table, tied or not; learned positions; token
types; relative position biases) and the readout's kernel (one fan fixed), keeps η. The
forward multipliers that go with it are `tfjax.models.mup`'s.

How it composes (docs/sweeps.md, "Tune small, train large"):
- The multipliers scale each leaf's whole update after the optimizer (`scale_by_multipliers`,
  last in the chain), which for Adam is η / m on that leaf exactly.
- AdamW's decoupled decay sits inside that update (optax: -η · (adam + wd · w)), so a hidden
  matrix decays by η · wd / m per step. The `mup` package (1.0.0) multiplies such a group's
  weight decay by m instead, keeping η · wd per step width-independent; raise
  `optim.weight_decay` by m for that behaviour.
- Gradient clipping acts before, on the raw gradients' global norm; Adam's update does not
  depend on the gradient's scale, so clipping changes the multipliers' effect only through
  the moments' mixing of clipped and unclipped steps.
- Muon: its hidden matrices' updates are orthogonalised and scaled by sqrt(fan_out / fan_in),
  which is already width-independent in the spectral sense (Yang, Simon & Bernstein 2023, "A
  Spectral Condition for Feature Learning"), so Muon leaves take no multiplier; its AdamW part
  holds only multiplier-1 leaves: under Muon μP changes the forward multipliers only.
- Vectorised sweeps: the trials of one program share the model, hence the multipliers, which
  `tfjax.training.vectorized` puts in each trial's traced optimizer.
"""

from collections.abc import Callable

import jax
import optax

from tfjax.models import ModelConfig, mup
from tfjax.training import muon

# Kernels outside `muon.muon_dimensions` whose two fans both grow with the width.
_HIDDEN_MODULES = ("pooler", "mlm_dense", "logits_proj")


def hidden_matrices(params):
    """A tree like `params`: True for the kernels of the hidden layers (both fans ∝ width)."""

    def named(path, _):
        names = muon.path_names(path)
        return len(names) >= 2 and names[-1] == "kernel" and names[-2] in _HIDDEN_MODULES

    by_name = jax.tree_util.tree_map_with_path(named, params)
    return jax.tree.map(lambda a, b: a or b, muon.muon_mask(params), by_name)


def lr_multipliers(cfg: ModelConfig, optimizer: str = "adam") -> Callable | None:
    """`params -> a tree of float multipliers` under μP (1/m on the hidden matrices, 1
    elsewhere; all 1 under `optimizer="muon"`), or None when every multiplier is 1 (the
    standard parametrization, or embed_dim == base_width): then the chain is today's."""
    ratio = mup.width_ratio(cfg)
    if ratio == 1.0 or optimizer == "muon":
        return None

    def multipliers(params):
        return jax.tree.map(lambda hidden: ratio if hidden else 1.0, hidden_matrices(params))

    return multipliers


def scale_by_multipliers(multipliers: Callable) -> optax.GradientTransformation:
    """Multiplies each leaf's update by `multipliers(updates)`'s value for it (stateless)."""

    def update_fn(updates, state, params=None):
        del params
        scales = multipliers(updates)
        return jax.tree.map(lambda u, c: u if c == 1.0 else u * c, updates, scales), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)
