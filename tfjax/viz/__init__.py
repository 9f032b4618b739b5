"""Pictures of what the library computes: positional tables, masks, attention, learning curves.

Every function returns a `matplotlib.figure.Figure` drawn without pyplot: the figure carries
its own Agg canvas, so it works in scripts, over SSH and in notebooks (`display(fig)`, or
leave it as a cell's last expression) and never changes the process-wide backend. `save`
writes one to disk at README size. To place a picture in a figure of one's own, pass its
matplotlib Axes as `ax=` (one Axes per panel for the pictures of several panels): the picture
is drawn there, with its colour bar, and the function returns that figure.

matplotlib is an optional dependency (the `viz` extra: `pip install "tfjax[viz]"`). It is
imported when a figure is drawn, not when this package is imported, so `import tfjax.viz`
works without it; drawing without it raises `tfjax.errors.DependencyError` with that command.

- `heatmaps`: `positional_heatmap`, `similarity_heatmap`, `mask_matrix`, `mask_grid`,
  `attention_map`, `attention_heads` (numpy or jax arrays in, shapes checked);
- `curves`: `learning_curves` (each workdir's metrics.jsonl; its only import from the rest
  of tfjax is `training.logger`);
- `canvas`: the lazy import, the Agg figure, `save`.
"""

from tfjax.viz.canvas import save
from tfjax.viz.curves import learning_curves
from tfjax.viz.heatmaps import (
    attention_heads,
    attention_map,
    mask_grid,
    mask_matrix,
    positional_heatmap,
    similarity_heatmap,
)

__all__ = [
    "attention_heads",
    "attention_map",
    "learning_curves",
    "mask_grid",
    "mask_matrix",
    "positional_heatmap",
    "save",
    "similarity_heatmap",
]
