"""The Maximal Update Parametrization's forward multipliers (`ModelConfig.parametrization`).

Source: G. Yang, E. Hu et al. 2022, "Tensor Programs V: Tuning Large Neural Networks via
Zero-Shot Hyperparameter Transfer" (arXiv 2203.03466), Table 3 (μP for Adam) and §J (the
Transformer: attention logits scaled by 1/d_head). With the width multiplier
m = embed_dim / base_width (every hidden width, `mlp_dim` and the heads' `head_dim`, assumed to
grow with `embed_dim` by the same factor, the number of heads fixed):

- hidden matrices keep an init variance ∝ 1/fan_in (tfjax's Xavier init already is, for widths
  that grow together) and take an Adam learning rate × 1/m (`tfjax.training.mup`);
- the token table is stored at the base width's scale (std base_width^-0.5, multiplied by
  sqrt(base_width) when `scale_embeddings`), so its coordinates, and those of its updates at a
  width-independent learning rate, are the same at every width (`embed_base_features`);
- the readout's input is multiplied by 1/m (`readout_multiplier`), not zero-initialised: the
  model at base_width is then today's model, and a tied table, which the input side needs
  nonzero, can be the readout too;
- attention logits are q·k · sqrt(base_head_dim) / head_dim instead of q·k / sqrt(head_dim),
  the constant chosen so that base_width gives today's scores (`query_multiplier`, applied to
  the queries); "dot" scores take q·k · base_head_dim / head_dim.

Under "standard", or at base_width, every multiplier is exactly 1.
"""

import math

from tfjax.models.config import ModelConfig


def width_ratio(cfg: ModelConfig) -> float:
    """1/m = base_width / embed_dim under "mup"; 1.0 under "standard"."""
    if cfg.parametrization != "mup":
        return 1.0
    return cfg.base_width / cfg.embed_dim


def readout_multiplier(cfg: ModelConfig) -> float:
    """What the output layer's (or classifier's) input is multiplied by: 1/m."""
    return width_ratio(cfg)


def query_multiplier(cfg: ModelConfig) -> float:
    """What the queries are multiplied by so that the logits scale as 1/head_dim: sqrt(1/m)
    for "scaled_dot" (q·k/sqrt(H) → q·k·sqrt(H_base)/H), 1/m for "dot"."""
    ratio = width_ratio(cfg)
    return math.sqrt(ratio) if cfg.score == "scaled_dot" else ratio


def embed_base_features(cfg: ModelConfig) -> float:
    """The width the token table's init std (width^-0.5) and sqrt scale use under "mup": the
    token width at base_width, fixed as the model widens (`layers.Embed.base_features`); 0
    (the table's own width) under "standard"."""
    if cfg.parametrization != "mup":
        return 0.0
    return cfg.token_width * width_ratio(cfg)
