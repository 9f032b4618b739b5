"""The docs' pictures: `python -m experiments.pictures [--out=experiments/figures]`.

Writes two PNGs drawn by `tfjax.viz` from the library's own arrays and prints their paths:
  * `positional_encoding.png`: `positional.sinusoidal_table(128, 64)` (base 10000, the paper's
    interleaved sin/cos), positions down, dimensions across;
  * `masks.png`: the masks of `tfjax.nn.masking` over 8 positions: padding (5 real tokens),
    causal, packed segments (3 + 4 tokens, then padding) and a window of radius 2.
Needs the `viz` extra (matplotlib). Deterministic: rerunning it redraws the same pictures.
"""

import os
import pathlib
from collections.abc import Sequence

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
POSITIONAL_FILE = "positional_encoding.png"
MASKS_FILE = "masks.png"


def masks() -> dict:
    """name -> [1, 1, 8, 8] bool mask, as the builders return it (True = may attend)."""
    import jax.numpy as jnp

    from tfjax.nn import masking

    padded = jnp.array([[1, 1, 1, 1, 1, 0, 0, 0]], dtype=jnp.int32)  # [B=1, L]: 5 tokens
    packed = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]], dtype=jnp.int32)  # [B=1, L]: 3 + 4 tokens
    return {
        "padding": masking.padding_mask(padded),
        "causal": masking.causal_mask(8),
        "packed segments": masking.segment_mask(packed),
        "window, radius 2": masking.window_mask(8, 2),
    }


def figures() -> dict:
    """File name -> the figure drawn into it (matplotlib Figures, drawn by `tfjax.viz`)."""
    from tfjax import viz
    from tfjax.nn import positional

    table = positional.sinusoidal_table(128, 64)  # [L, D]
    title = "sinusoidal positions (base 10000): 128 positions x 64 dims"
    return {
        POSITIONAL_FILE: viz.positional_heatmap(table, title=title),
        MASKS_FILE: viz.mask_grid(masks()),
    }


def write_pictures(out: str | pathlib.Path) -> list[pathlib.Path]:
    """Writes `positional_encoding.png` and `masks.png` into `out`; returns their paths."""
    from tfjax import viz

    return [viz.save(fig, pathlib.Path(out) / name) for name, fig in figures().items()]


def main(argv: Sequence[str]) -> None:
    """Writes the pictures into `--out` and prints the paths."""
    cli.no_arguments(argv)
    # Arrays this small need no accelerator: do not start one (nor libtpu's start-up notices).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for path in write_pictures(FLAGS.out):
        print(path)


def _define_flags() -> None:
    """Flags exist only when run as a script, so importing this module defines none."""
    flags.DEFINE_string("out", "experiments/figures", "Folder to write the PNGs into.")


if __name__ == "__main__":
    _define_flags()
    cli.main(main)
