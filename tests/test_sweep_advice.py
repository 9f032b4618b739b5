"""The sweep summary's verdict (experiments.sweep_advice) and the seed statistics under it
(experiments.seed_stats), on literal tables."""

import math
import statistics

import pytest

from experiments import seed_stats, sweep_advice, sweep_summary


def _row(lr, loss, seed=0, status="ok", **more):
    row = {"run": f"lr{lr}-{seed}", "status": status, "optim.learning_rate": lr, **more}
    return {**row, "seed": seed, "eval/loss": loss}


def _edge(rows, key="optim.learning_rate"):
    found = sweep_advice.settings(rows)
    best = sweep_advice.ranked(found, "eval/loss", lower_is_better=True)[0]
    return next(e for e in sweep_advice.edges(found, best) if e.key == key)


def test_best_at_the_highest_edge_suggests_the_grids_ratio_beyond_it():
    rows = [_row("0.1", 2.0), _row("0.3", 1.5), _row("1.0", 1.2)]
    edge = _edge(rows)
    assert (edge.best, edge.side, edge.values) == ("1.0", "highest", (0.1, 0.3, 1.0))
    # Geometric grid: mean ratio (1.0 / 0.1) ** (1 / 2) = 3.1623; 1.0 * r, 1.0 * r ** 2 to 3
    # significant digits.
    assert edge.next_values == (1.0, 3.16, 10.0)
    lines = sweep_advice.report(rows)
    assert (
        "- `optim.learning_rate`: the best value, 1.0, is the highest swept (0.1, 0.3, 1): "
        "the optimum may lie above it; next range: 1, 3.16, 10." in lines
    )
    assert lines[-1].startswith("- Not done: the best lies at the edge of `optim.learning_rate`")


def test_best_at_the_lowest_edge_of_a_higher_is_better_metric():
    rows = [
        {"run": str(i), "status": "ok", "optim.learning_rate": lr, "eval/bleu": bleu}
        for i, (lr, bleu) in enumerate([("0.001", 30.0), ("0.002", 20.0), ("0.004", 10.0)])
    ]
    found = sweep_advice.settings(rows)
    assert sweep_advice.chosen_metric(found) == ("eval/bleu", False)
    lines = sweep_advice.report(rows)
    # Ratio 2: 0.001 / 4, 0.001 / 2 below the lowest value.
    assert any(
        "is the lowest swept" in line and "next range: 0.00025, 0.0005, 0.001" in line
        for line in lines
    )


def test_best_in_the_middle_is_no_edge_and_the_sweep_is_done():
    rows = [_row("0.1", 2.0), _row("0.3", 1.1), _row("1.0", 1.4)]
    edge = _edge(rows)
    assert (edge.best, edge.side, edge.next_values) == ("0.3", None, ())
    lines = sweep_advice.report(rows)
    assert (
        "- `optim.learning_rate`: the best value, 0.3, lies inside the range swept "
        "(0.1, 0.3, 1)." in lines
    )
    assert not any("Not done" in line for line in lines)
    assert lines[-1].startswith("- Done as far as the ranges go")


def test_arithmetic_and_integer_grids_step_beyond_and_stop_at_zero_or_one():
    # Evenly spaced (differences 0.1, 0.1; log ratios 0.69, 0.41): step 0.1, and nothing
    # below 0 for a key swept at values >= 0.
    assert sweep_advice.geometric((0.1, 0.2, 0.3)) is False
    assert sweep_advice.next_range((0.1, 0.2, 0.3), "lowest", integer=False) == (0.0, 0.1)
    assert sweep_advice.next_range((0.1, 0.2, 0.3), "highest", integer=False) == (0.3, 0.4, 0.5)
    assert sweep_advice.next_range((2.0, 4.0, 6.0), "highest", integer=True) == (6.0, 8.0, 10.0)
    assert sweep_advice.next_range((1.0, 2.0, 3.0), "lowest", integer=True) == (1.0,)
    rows = [
        _row(lr, loss, **{"model.num_layers": n})
        for lr, loss, n in [("0.1", 1.0, "1"), ("0.1", 1.5, "2"), ("0.1", 1.7, "3")]
    ]
    edge = _edge(rows, "model.num_layers")
    assert (edge.side, edge.integer, edge.open) == ("lowest", True, False)
    assert "nothing below it to try" in sweep_advice.edge_line(edge)
    assert sweep_advice.report(rows)[-1].startswith("- Done")


def _t_and_df(a, b):
    """Welch's statistic and Welch-Satterthwaite degrees of freedom, written out."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df


def test_welch_statistic_and_p_value_against_the_formula_and_t_tables():
    a, b = [1.0, 1.2, 1.1], [1.3, 1.5, 1.45]
    t, df = _t_and_df(a, b)
    result = seed_stats.welch(seed_stats.spread(a), seed_stats.spread(b))
    assert (result.t, result.df) == pytest.approx((t, df))
    assert t == pytest.approx(-3.8) and df == pytest.approx(3.99361, rel=1e-5)
    # Two-sided 5% critical values of Student's t (any table): df 1: 12.706, 4: 2.776,
    # 30: 2.042; the p of the critical value is 0.05.
    for crit, dof in [(12.706, 1), (2.776, 4), (2.042, 30)]:
        assert seed_stats.student_t_two_sided_p(crit, dof) == pytest.approx(0.05, abs=2e-4)
    assert seed_stats.student_t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    # |t| = 3.8 is above the critical value near df = 4 (2.776): separable.
    assert result.p < 0.05 and result.separable
    close = seed_stats.welch(seed_stats.spread(a), seed_stats.spread([1.05, 1.25, 1.2]))
    t_close, _ = _t_and_df(a, [1.05, 1.25, 1.2])
    assert abs(t_close) < 2.776 and close.p > 0.05 and not close.separable
    assert seed_stats.welch(seed_stats.spread([1.0]), seed_stats.spread(a)) is None


def test_welch_p_equals_scipy_where_installed():
    stats = pytest.importorskip("scipy.stats")
    for a, b in [([1.0, 1.2, 1.1], [1.3, 1.5, 1.45]), ([5, 6, 7, 9], [4.5, 5.0]), ([0, 1], [3, 9])]:
        ours = seed_stats.welch(seed_stats.spread(a), seed_stats.spread(b))
        theirs = stats.ttest_ind(a, b, equal_var=False)
        assert ours.p == pytest.approx(theirs.pvalue, rel=1e-9)


def test_report_says_whether_the_best_and_the_runner_up_are_separable():
    def rows(second):
        firsts = [_row("0.3", loss, seed) for seed, loss in enumerate([1.0, 1.2, 1.1])]
        worst = [_row("1.0", 3.0, seed) for seed in range(3)]  # the best is not at an edge
        return [*firsts, *(_row("0.1", loss, seed) for seed, loss in enumerate(second)), *worst]

    apart = sweep_advice.report(rows([1.3, 1.5, 1.45]))
    assert "- Best: optim.learning_rate=0.3: 1.1 ± 0.1 (n = 3)." in apart
    assert "- Runner-up: optim.learning_rate=0.1: 1.417 ± 0.1 (n = 3)." in apart
    assert any(
        line.startswith("- Separable (Welch's t-test, two-sided p < 0.05): yes") for line in apart
    )
    assert apart[-1].startswith("- Done: the best lies inside every numeric range swept")
    near = sweep_advice.report(rows([1.05, 1.25, 1.2]))
    assert any(
        line.startswith("- Separable (Welch's t-test, two-sided p < 0.05): no") for line in near
    )
    assert near[-1] == "- Not done: the best is not separable from the runner-up: add seeds."
    single = sweep_advice.report([_row("0.3", 1.0), _row("0.1", 1.2)])
    assert any("cannot tell with one run per setting" in line for line in single)


def test_failed_runs_and_missing_metrics_are_left_out_of_the_ranking():
    rows = [_row("0.1", 1.5), _row("0.3", 0.5, status="failed (exit 1)"), _row("1.0", None)]
    found = sweep_advice.settings(rows)
    assert [s.overrides for s in found] == [
        {"optim.learning_rate": "0.1"},
        {"optim.learning_rate": "1.0"},
    ]
    assert [s.label for s in sweep_advice.ranked(found, "eval/loss", True)] == [
        "optim.learning_rate=0.1"
    ]
    assert sweep_advice.report([{"run": "a", "status": "failed (exit 1)"}]) == []


def test_the_sweeps_closing_lines_count_runs_and_end_with_the_verdict(tmp_path):
    rows = [
        _row("0.1", 2.0),
        _row("0.3", 1.5),
        _row("1.0", 1.2),
        _row("3.0", None, status="failed (exit 1)"),
    ]
    lines = sweep_summary.closing_lines(rows, tmp_path)
    assert lines[0] == f"summary: {tmp_path / 'summary.md'} (3 ok, 1 failed: lr3.0-0)"
    assert lines[1:] == sweep_advice.report(rows)
    sweep_summary.write_summary(rows, tmp_path)
    assert (tmp_path / "summary.md").read_text().endswith("\n".join(lines[1:]) + "\n")
