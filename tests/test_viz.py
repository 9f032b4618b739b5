"""Tests for tfjax.viz: the data each figure draws, its labels, the shape errors, the extra.

Every check reads the figure back (`ax.images[0].get_array()`, `ax.lines`, tick labels) and
compares it with the arrays given or with what `tfjax.training.logger` wrote, so a picture that
is transposed, loses points or labels fails here. matplotlib comes with the `test` extra.
"""

import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import errors, viz
from tfjax.nn import masking, positional
from tfjax.training import logger

REPO = pathlib.Path(__file__).resolve().parents[1]


def _image(ax) -> np.ndarray:
    (image,) = ax.images
    return np.ma.getdata(image.get_array())


def _panels(fig) -> list:
    """The axes holding an image, in order (colour bars hold none)."""
    return [ax for ax in fig.axes if ax.images]


def _colorbars(fig) -> list:
    return [ax for ax in fig.axes if not ax.images]


def _ticks(labels) -> list[str]:
    return [label.get_text() for label in labels]


def _weights(*shape: int) -> np.ndarray:
    weights = np.random.default_rng(0).random(shape).astype(np.float32)
    return weights / weights.sum(-1, keepdims=True)


def test_positional_heatmap_draws_the_table_positions_down():
    table = positional.sinusoidal_table(16, 8)  # [L, D], a jax array
    fig = viz.positional_heatmap(table, title="base 10000")
    ax = _panels(fig)[0]
    np.testing.assert_array_equal(_image(ax), np.asarray(table))  # not transposed
    assert (ax.get_ylabel(), ax.get_xlabel(), ax.get_title()) == (
        "position",
        "dimension d",
        "base 10000",
    )
    assert len(_colorbars(fig)) == 1
    assert _image(ax).min() < 0 < _image(ax).max()
    assert ax.images[0].get_clim() == (-1.0, 1.0)  # centred on 0


def test_similarity_heatmap_draws_the_dot_products():
    table = np.asarray(positional.sinusoidal_table(12, 8, base=100.0))
    fig = viz.similarity_heatmap(table)
    ax = _panels(fig)[0]
    np.testing.assert_allclose(_image(ax), table @ table.T, rtol=1e-6)
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert len(_colorbars(fig)) == 1


def test_mask_matrix_draws_the_mask_and_drops_leading_ones():
    mask = masking.causal_mask(3, 5)  # [1, 1, L=3, S=5]
    keys = ["a", "b", "c", "d", "e"]
    fig = viz.mask_matrix(mask, query_labels=["x", "y", "z"], key_labels=keys, title="m")
    ax = _panels(fig)[0]
    np.testing.assert_array_equal(_image(ax), np.asarray(mask)[0, 0])
    assert _image(ax).dtype == bool
    assert _ticks(ax.get_xticklabels()) == keys
    assert _ticks(ax.get_yticklabels()) == ["x", "y", "z"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("key", "query", "m")
    (bar,) = _colorbars(fig)
    assert _ticks(bar.get_yticklabels()) == ["False: masked", "True: attends"]


def test_mask_matrix_numbers_small_masks_and_takes_0_1_ints():
    mask = np.array([[1, 0], [1, 1]], dtype=np.int32)
    ax = _panels(viz.mask_matrix(mask))[0]
    np.testing.assert_array_equal(_image(ax), mask.astype(bool))
    assert _ticks(ax.get_xticklabels()) == ["0", "1"]
    with pytest.raises(ValueError, match=r"mask must be bool \(True = attend\), got float32"):
        viz.mask_matrix(np.ones((2, 2), np.float32))


def test_mask_grid_has_one_titled_panel_per_mask():
    segment_ids = jnp.array([[1, 1, 2, 2, 0]])  # [B=1, L=5]
    masks = {
        "causal": masking.causal_mask(5),
        "packed": masking.segment_mask(segment_ids),
        "window": masking.window_mask(4, 1),  # another shape
    }
    fig = viz.mask_grid(masks, ncols=2)
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == list(masks)
    for ax, mask in zip(panels, masks.values(), strict=True):
        np.testing.assert_array_equal(_image(ax), np.asarray(mask)[0, 0])
    assert len(_colorbars(fig)) == 1
    assert len(fig.axes) == 4  # the empty fourth place of the 2 x 2 grid is removed


def test_attention_map_draws_the_weights_with_token_labels():
    queries, keys = ["le", "chat", "dort"], ["the", "cat", "is", "asleep", "</s>"]
    weights = _weights(3, 5)  # [L, S]
    fig = viz.attention_map(jnp.asarray(weights), query_tokens=queries, key_tokens=keys)
    ax = _panels(fig)[0]
    np.testing.assert_allclose(_image(ax), weights)
    assert _ticks(ax.get_xticklabels()) == keys
    assert _ticks(ax.get_yticklabels()) == queries
    assert all(label.get_rotation() == 90 for label in ax.get_xticklabels())
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "key",
        "query",
        "attention weights",
    )
    assert len(_colorbars(fig)) == 1


def test_attention_map_takes_one_example_of_one_head():
    weights = _weights(1, 1, 4, 4)  # [B=1, N=1, L, S]
    np.testing.assert_allclose(_image(_panels(viz.attention_map(weights))[0]), weights[0, 0])


def test_attention_figures_make_room_for_long_rotated_labels_and_a_title():
    weights = np.full((2, 3, 4), 0.25)
    short, long = ["a"] * 4, ["I_TURN_LEFT"] * 4

    def height(draw, values, **kwargs):
        return draw(values, query_tokens=["q"] * 3, **kwargs).get_size_inches()[1]

    for draw, values in ((viz.attention_heads, weights), (viz.attention_map, weights[0])):
        assert height(draw, values, key_tokens=long) > height(draw, values, key_tokens=short)
    plain = height(viz.attention_heads, weights, key_tokens=short)
    assert height(viz.attention_heads, weights, key_tokens=short, title="t") > plain


def test_attention_heads_has_a_panel_per_head_and_one_colour_bar():
    queries, keys = ["a", "b"], ["p", "q", "r", "s"]
    weights = _weights(5, 2, 4)  # [N, L, S]
    fig = viz.attention_heads(weights, query_tokens=queries, key_tokens=keys, title="layer 0")
    panels = _panels(fig)
    assert len(panels) == 5 and len(_colorbars(fig)) == 1
    for head, ax in enumerate(panels):
        np.testing.assert_allclose(_image(ax), weights[head])
        assert ax.get_title() == f"head {head}"
        assert _ticks(ax.get_xticklabels()) == keys
        assert ax.images[0].get_clim() == (0.0, pytest.approx(weights.max()))  # one scale
    assert _ticks(panels[0].get_yticklabels()) == queries  # first of each row of 4
    assert _ticks(panels[4].get_yticklabels()) == queries
    assert fig.get_suptitle() == "layer 0"


@pytest.mark.parametrize(
    "draw, message",
    [
        (lambda: viz.positional_heatmap(np.zeros(4)), r"table must be \[L, D\].*got shape \(4,\)"),
        (lambda: viz.similarity_heatmap(np.zeros((2, 3, 4))), r"\[L, D\].*\(2, 3, 4\)"),
        (lambda: viz.mask_matrix(np.ones((2, 1, 3), bool)), r"mask must be \[L, S\].*\(2, 1, 3\)"),
        (lambda: viz.mask_grid({"bad": np.ones(3, bool)}), r"mask 'bad' must be \[L, S\]"),
        (lambda: viz.mask_grid({}), r"masks is empty"),
        (lambda: viz.attention_map(_weights(2, 3, 4)), r"weights must be \[L, S\].*\(2, 3, 4\)"),
        (lambda: viz.attention_heads(_weights(3, 4)), r"weights must be \[N, L, S\].*\(3, 4\)"),
        (lambda: viz.attention_heads(_weights(2, 3, 4), ncols=0), r"ncols must be >= 1"),
        (
            lambda: viz.attention_map(_weights(2, 3), key_tokens=["a", "b"]),
            r"key_tokens has 2 labels for S .* = 3",
        ),
        (
            lambda: viz.attention_heads(_weights(1, 2, 3), query_tokens=["a"]),
            r"query_tokens has 1 labels for L .* = 2",
        ),
        (
            lambda: viz.mask_matrix(np.ones((2, 3), bool), key_labels=["a"]),
            r"key_labels has 1 labels for S = 3",
        ),
    ],
)
def test_bad_shapes_name_the_expected_one(draw, message):
    with pytest.raises(ValueError, match=message):
        draw()


def _write_run(workdir: pathlib.Path, losses: list[float], eval_every: int = 2) -> None:
    with logger.MetricWriter(workdir) as writer:
        for step, loss in enumerate(losses, start=1):
            writer.write(step, "train", {"loss": loss, "learning_rate": 0.1})
            if step % eval_every == 0:
                writer.write(step, "eval", {"loss": loss + 0.5, "bleu": 10.0 * step})
        # At the step of a periodic evaluation it is not on the eval curve; after it, it is.
        writer.write(len(losses), "final_eval", {"loss": losses[-1] + 0.4, "bleu": 1.0})


def _line(ax, label: str) -> tuple[list, list]:
    """(steps, values) of the one line labelled `label`."""
    (line,) = [line for line in ax.lines if line.get_label() == label]
    return list(line.get_xdata()), list(line.get_ydata())


def _xy(points: list[tuple]) -> tuple[list, list]:
    return [x for x, _ in points], [y for _, y in points]


def test_learning_curves_draw_what_the_logger_wrote(tmp_path):
    _write_run(tmp_path / "a", [40.0, 8.0, 3.0, 1.0])  # spans 40x: log scale
    _write_run(tmp_path / "b", [4.0, 3.0, 2.0, 1.5])
    fig = viz.learning_curves([tmp_path / "a", tmp_path / "b"], metrics=("loss", "bleu"))
    loss, bleu = fig.axes[:2]
    for run in ("a", "b"):
        records = logger.read_metrics(tmp_path / run)
        train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
        evals = [(r["step"], r["loss"]) for r in records if r["kind"] == "eval"]
        assert _line(loss, f"{run}: train") == _xy(train)
        assert _line(loss, f"{run}: eval") == _xy(evals)  # final_eval at step 4 left out
        assert len(train) == 4 and len(evals) == 2
        assert _line(bleu, f"{run}: eval") == ([2, 4], [20.0, 40.0])
    assert [line.get_marker() for line in loss.lines] == ["None", "o", "None", "o"]
    colors = [line.get_color() for line in loss.lines]
    assert colors[0] == colors[1] != colors[2] == colors[3]  # one colour per run
    assert loss.get_yscale() == "log" and bleu.get_yscale() == "linear"
    assert (loss.get_title(), loss.get_xlabel(), loss.get_ylabel()) == ("loss", "step", "loss")
    assert not [line for line in bleu.lines if line.get_label().endswith("train")]
    legend = [text.get_text() for text in fig.legends[0].get_texts()]
    assert legend == ["a", "b", "train", "eval"]


def test_learning_curves_are_linear_within_10x_and_take_labels(tmp_path):
    _write_run(tmp_path / "run", [4.0, 3.0, 2.0, 1.0], eval_every=10)  # no periodic eval
    fig = viz.learning_curves({"baseline": tmp_path / "run"}, metrics="loss", title="t")
    (ax,) = [ax for ax in fig.axes if ax.lines]
    assert ax.get_yscale() == "linear" and fig.get_suptitle() == "t"
    assert _line(ax, "baseline: train") == ([1, 2, 3, 4], [4.0, 3.0, 2.0, 1.0])
    assert _line(ax, "baseline: eval") == ([4], [1.4])  # the final evaluation alone


def test_learning_curves_name_a_workdir_without_metrics(tmp_path):
    _write_run(tmp_path / "good", [1.0, 2.0])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"workdir .*empty holds no metrics\.jsonl"):
        viz.learning_curves([tmp_path / "good", tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match=r"workdir .*nope does not exist"):
        viz.learning_curves(tmp_path / "nope")
    with pytest.raises(
        errors.WorkdirError, match="no run logged 'accuracy'; the runs logged bleu, "
    ):
        viz.learning_curves(tmp_path / "good", metrics=["accuracy"])


def test_save_writes_a_png_at_readme_size(tmp_path):
    from matplotlib import image

    path = viz.save(viz.similarity_heatmap(np.eye(4)), tmp_path / "new" / "sim.png")
    assert path == tmp_path / "new" / "sim.png"
    assert image.imread(path).shape == (480, 560, 4)  # 5.6 x 4.8 inches at 100 dpi


def test_missing_matplotlib_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(errors.DependencyError, match=r'pip install "tfjax\[viz\]"') as info:
        viz.attention_map(np.eye(2))
    assert "\n" not in str(info.value)


def test_importing_needs_no_matplotlib_and_drawing_no_pyplot():
    check = (
        "import sys, numpy, tfjax.viz\n"
        "assert 'matplotlib' not in sys.modules, 'imported matplotlib'\n"
        "tfjax.viz.attention_map(numpy.eye(2))\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'imported pyplot'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_figures_show_as_png_in_notebooks():
    from matplotlib import figure

    fig = viz.mask_matrix(np.eye(2, dtype=bool))
    assert isinstance(fig, figure.Figure)
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"  # what IPython's display shows


def test_pictures_draw_into_the_callers_axes_of_one_figure(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    table = np.asarray(positional.sinusoidal_table(6, 4))
    mask = np.tril(np.ones((3, 3), bool))
    assert viz.positional_heatmap(table, ax=left) is fig
    assert viz.mask_matrix(mask, ax=right, title="causal") is fig
    np.testing.assert_array_equal(_image(left), table)  # each picture in the axes given
    np.testing.assert_array_equal(_image(right), mask)
    assert right.get_title() == "causal" and left.get_xlabel() == "dimension d"
    assert len(_colorbars(fig)) == 2 and _panels(fig) == [left, right]  # nothing else added
    # Several panels: one Axes per panel, in order.
    _write_run(tmp_path / "a", [4.0, 3.0, 2.0, 1.5])
    curves = Figure()
    loss, bleu = curves.subplots(1, 2)
    assert viz.learning_curves(tmp_path / "a", metrics=("loss", "bleu"), ax=[loss, bleu]) is curves
    assert _line(loss, "a: train")[1] == [4.0, 3.0, 2.0, 1.5]
    assert _line(bleu, "a: eval") == ([2, 4], [20.0, 40.0])
    assert [t.get_text() for t in bleu.get_legend().get_texts()] == ["a", "train", "eval"]
    heads = Figure()
    assert viz.attention_heads(_weights(2, 3, 3), ax=heads.subplots(1, 2)) is heads
    assert len(_panels(heads)) == 2
    with pytest.raises(ValueError, match="ax must be 2 matplotlib Axes"):
        viz.learning_curves(tmp_path / "a", metrics=("loss", "bleu"), ax=loss)
    with pytest.raises(ValueError, match="ax must be a matplotlib Axes"):
        viz.positional_heatmap(table, ax="left")
