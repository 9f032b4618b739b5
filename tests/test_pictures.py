"""Tests for experiments/pictures.py: the README's two pictures and what they show."""

import numpy as np

from experiments import pictures
from tfjax.nn import positional


def test_the_pictures_show_the_table_and_the_four_masks():
    figures = pictures.figures()
    assert list(figures) == ["positional_encoding.png", "masks.png"]
    (table,) = figures["positional_encoding.png"].axes[0].images
    np.testing.assert_array_equal(table.get_array(), positional.sinusoidal_table(128, 64))
    masks = pictures.masks()
    panels = [ax for ax in figures["masks.png"].axes if ax.images]
    assert [ax.get_title() for ax in panels] == list(masks)
    for ax, mask in zip(panels, masks.values(), strict=True):
        np.testing.assert_array_equal(ax.images[0].get_array(), np.asarray(mask)[0, 0])
    assert np.asarray(masks["packed segments"])[0, 0, 0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]


def test_write_pictures_writes_small_pngs(tmp_path):
    from matplotlib import image

    paths = pictures.write_pictures(tmp_path / "figures")
    assert paths == [
        tmp_path / "figures" / "positional_encoding.png",
        tmp_path / "figures" / "masks.png",
    ]
    for path in paths:
        assert image.imread(path).shape[2] == 4
        assert 10_000 < path.stat().st_size < 150_000  # README-sized
