"""Population-based training on a vectorised sweep's trial axis (tfjax.runs.pbt,
tfjax.training.population): who copies whom, the gather and the exploration against literal
numpy references, and whole sweeps (slow): a copy continues bit-equal to what it copied, PBT
that replaces nothing is the plain vectorised sweep, a killed PBT sweep resumes exactly.
"""

import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from tfjax import errors
from tfjax.data import pipeline
from tfjax.runs import pbt, restoration, vsweep, vsweep_build, vsweep_state
from tfjax.training import logger, population, vectorized

COMMON = [
    "data.name=reverse",
    "data.num_train_examples=96",
    "data.num_eval_examples=8",
    "data.task_max_len=6",
    "data.max_source_len=8",
    "data.max_target_len=8",
    "model.dropout_rate=0.1",
    "model.use_bias=false",
    "train.num_train_steps=8",
    "train.log_every_steps=2",
    "train.eval_every_steps=4",
    "train.checkpoint_every_steps=4",
    "train.keep_checkpoints=4",
]
PBT = ["sweep.pbt.interval=4", "sweep.pbt.fraction=0.5"]


def _config(*overrides):
    return config_utils.load_config("configs/base.py:tiny", [*COMMON, *overrides])


def _trials(root: pathlib.Path, rates, *extra):
    return [
        vsweep.Trial(f"t{i}", _config(f"optim.learning_rate={rate}", *extra), root / f"t{i}")
        for i, rate in enumerate(rates)
    ]


def _final_params(trials, group_dir: pathlib.Path):
    """Each trial's parameters at the group's last step, extracted as an ordinary workdir (as
    `experiments.sweep --extract` does) and restored as a run alone."""
    out = []
    for trial in trials:
        vsweep_state.extract(group_dir, trial.workdir)
        out.append(jax.device_get(restoration.restore(trial.config, trial.workdir)[1].state.params))
    return out


def test_plan_ranks_the_live_trials_and_the_worst_copy_the_best():
    # Six trials, trial 4 not live (not ranked); eval loss "min": the best are 2 (0.1), 5 (0.2),
    # the worst 3 (nan: last), 0 (0.9); floor(0.5 * 5) = 2 copies: 3 <- 2, 0 <- 5.
    scores = {0: 0.9, 1: 0.5, 2: 0.1, 3: float("nan"), 5: 0.2}
    np.testing.assert_array_equal(pbt.plan(scores, 6, 0.5, "min"), [5, 1, 2, 2, 4, 5])
    # "max": 0 (0.9) and 1 (0.5) best; nan still last, then 2 (0.1): 3 <- 0, 2 <- 1.
    np.testing.assert_array_equal(pbt.plan(scores, 6, 0.5, "max"), [0, 1, 1, 0, 4, 5])
    np.testing.assert_array_equal(pbt.plan(scores, 6, 0.0, "min"), np.arange(6))


def test_exploit_and_explore_on_a_fixed_ranking_equal_a_numpy_reference():
    source = np.array([5, 1, 2, 2, 4, 5], np.int32)
    params = {"w": np.arange(12, dtype=np.float32).reshape(6, 2), "b": np.arange(6.0) * 10}
    state = vectorized.SweepState(train=types.SimpleNamespace(), live=np.ones(6, bool)).replace(
        train={"params": params, "opt": {"mu": -np.arange(6.0)}}
    )
    copied = population.exploit(state, jnp.asarray(source))
    reference = {  # rows 0 and 3 are those of 5 and 2, written out
        "w": np.array([[10, 11], [2, 3], [4, 5], [4, 5], [8, 9], [10, 11]], np.float32),
        "b": np.array([50.0, 10, 20, 20, 40, 50]),
    }
    for name in ("w", "b"):
        np.testing.assert_array_equal(copied.train["params"][name], reference[name])
    np.testing.assert_array_equal(copied.train["opt"]["mu"], [-5.0, -1, -2, -2, -4, -5])
    hyper = {
        "learning_rate": jnp.asarray([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], jnp.float32),
        "b1": jnp.asarray([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], jnp.float32),
        "schedule": jnp.asarray([0, 1, 0, 1, 0, 1], jnp.int32),
    }
    choices = {"learning_rate": jnp.asarray([7.0], jnp.float32)}
    key = jax.random.key(3)
    kwargs = dict(names=("learning_rate",), choices=choices)
    doubled, next_key = population.explore(
        hyper,
        jnp.asarray(source),
        key,
        factors=jnp.asarray([2.0]),
        resample_probability=0.0,
        **kwargs,
    )
    # Copies take every hyperparameter of their source; the explored one doubles.
    np.testing.assert_array_equal(
        doubled["learning_rate"], np.float32([1.2, 0.2, 0.3, 0.6, 0.5, 0.6])
    )
    np.testing.assert_array_equal(doubled["b1"], np.float32([0.4, 0.8, 0.7, 0.7, 0.5, 0.4]))
    np.testing.assert_array_equal(doubled["schedule"], [1, 1, 0, 0, 0, 1])
    assert doubled["schedule"].dtype == jnp.int32 and doubled["b1"].dtype == jnp.float32
    assert not np.array_equal(jax.random.key_data(next_key), jax.random.key_data(key))
    resampled, _ = population.explore(
        hyper,
        jnp.asarray(source),
        key,
        factors=jnp.asarray([2.0]),
        resample_probability=1.0,
        **kwargs,
    )
    np.testing.assert_array_equal(
        resampled["learning_rate"], np.float32([7.0, 0.2, 0.3, 7.0, 0.5, 0.6])
    )


def test_explore_draws_each_factor_and_only_for_the_copies():
    source = jnp.asarray(np.r_[np.zeros(200), np.arange(200, 400)].astype(np.int32))
    hyper = {"learning_rate": jnp.full(400, 1.0, jnp.float32)}
    out, _ = population.explore(
        hyper,
        source,
        jax.random.key(0),
        names=("learning_rate",),
        factors=jnp.asarray([0.5, 2.0]),
        resample_probability=0.0,
        choices={"learning_rate": jnp.asarray([1.0])},
    )
    lr = np.asarray(out["learning_rate"])
    assert set(lr[1:200].tolist()) == {0.5, 2.0}  # both factors, for the copies only
    assert lr[0] == 1.0 and (lr[200:] == 1.0).all()


def test_the_population_round_trips_through_its_saved_json():
    settings = pbt.settings([_config(*PBT, "optim.grad_clip_norm=0")])
    hyper = {
        "learning_rate": jnp.asarray([0.1, 0.3], jnp.float32),
        "grad_clip_norm": jnp.full(2, jnp.inf),
    }
    first = pbt.Population(settings, hyper)
    first.hyper, first.key = first._explore(first.hyper, jnp.asarray([0, 0]), first.key)
    first.lineage.append({"step": 4, "trial": 1, "source": 0})
    import json

    second = pbt.Population(settings, hyper)
    second.load(json.loads(json.dumps(first.state_dict())))
    for name in hyper:
        np.testing.assert_array_equal(second.hyper[name], first.hyper[name])
    np.testing.assert_array_equal(jax.random.key_data(second.key), jax.random.key_data(first.key))
    assert second.lineage == first.lineage


def test_bad_pbt_settings_and_pbt_with_halving_are_one_line_errors():
    with pytest.raises(errors.ConfigError, match=r"halving_steps and sweep\.pbt\.interval cannot"):
        pbt.settings([_config(*PBT, "sweep.halving_steps=4")])
    with pytest.raises(errors.ConfigError, match="fraction must be in"):
        pbt.settings([_config(*PBT, "sweep.pbt.fraction=0.7")])
    with pytest.raises(errors.ConfigError, match="'seed' cannot be explored"):
        pbt.settings([_config(*PBT, "sweep.pbt.hyperparameters=seed")])
    with pytest.raises(errors.ConfigError, match="differs between the trials"):
        pbt.settings([_config(*PBT), _config("sweep.pbt.interval=2")])
    assert pbt.settings([_config()]) is None


def _compiled_steps(monkeypatch):
    """The vectorised steps the sweeps compile (their jit caches: one entry each)."""
    steps = []
    original = vsweep_build.Group._compile

    def keep(self):
        steps.append(original(self))
        return steps[-1]

    monkeypatch.setattr(vsweep_build.Group, "_compile", keep)
    return steps


@pytest.mark.slow
def test_a_trial_that_copied_another_continues_bit_equal_to_it(tmp_path, monkeypatch):
    """Two trials with one seed (one data order, one dropout key) and factor 1: after t0 copies
    t1 at step 4 it trains exactly as t1, to the last bit; the step is compiled once."""
    steps = _compiled_steps(monkeypatch)
    trials = _trials(tmp_path, [0.05, 1.0], *PBT, "sweep.pbt.perturb_factors=1.0")
    outcomes = vsweep.train_trials(trials, tmp_path / "group")
    assert [o.status for o in outcomes] == ["ok", "ok"]
    params = _final_params(trials, tmp_path / "group")
    jax.tree.map(np.testing.assert_array_equal, params[0], params[1])
    pbt_rows = logger.read_metrics(trials[0].workdir, "pbt")
    assert [(r["step"], r["copied_from"]) for r in pbt_rows] == [(0, -1), (4, 1)]
    assert pbt_rows[1]["optim.learning_rate"] == np.float32(1.0)
    assert "| 4 | t0 | t1 |" in (tmp_path / "group" / pbt.LINEAGE_FILE).read_text()
    assert steps[0]._cache_size() == 1  # new hyperparameters, no new program


@pytest.mark.slow
def test_pbt_that_replaces_nothing_is_the_plain_vectorised_sweep(tmp_path):
    rates = [0.05, 1.0]
    plain = _trials(tmp_path / "plain", rates)
    vsweep.train_trials(plain, tmp_path / "plain" / "group")
    none = _trials(tmp_path / "pbt", rates, *PBT, "sweep.pbt.fraction=0")
    vsweep.train_trials(none, tmp_path / "pbt" / "group")
    a, b = (
        _final_params(plain, tmp_path / "plain" / "group"),
        _final_params(none, tmp_path / "pbt" / "group"),
    )
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_a_killed_pbt_sweep_resumes_bit_equal_to_an_uninterrupted_one(tmp_path, monkeypatch):
    """Killed after step 6 (PBT acted at step 4, checkpoint at 4): the rerun restores the
    population, lineage and explore key and ends where the uninterrupted sweep ends."""
    rates, extra = [0.05, 0.2, 1.0, 3.0], [*PBT, "train.num_train_steps=12", "seed=1"]
    whole = _trials(tmp_path / "whole", rates, *extra)
    vsweep.train_trials(whole, tmp_path / "whole" / "group")
    original = pipeline.BatchIterator.__next__
    calls = {"n": 0}

    def crash_after_six_steps(self):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt("simulated kill")
        return original(self)

    trials = _trials(tmp_path / "killed", rates, *extra)
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", crash_after_six_steps)
    with pytest.raises(KeyboardInterrupt):
        vsweep.train_trials(trials, tmp_path / "killed" / "group")
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", original)
    vsweep.train_trials(trials, tmp_path / "killed" / "group")
    a = _final_params(whole, tmp_path / "whole" / "group")
    b = _final_params(trials, tmp_path / "killed" / "group")
    jax.tree.map(np.testing.assert_array_equal, a, b)
    for x, y in zip(whole, trials, strict=True):
        assert logger.read_metrics(x.workdir, "pbt") == logger.read_metrics(y.workdir, "pbt")
    lineage = (tmp_path / "whole" / "group" / pbt.LINEAGE_FILE).read_text()
    assert lineage == (tmp_path / "killed" / "group" / pbt.LINEAGE_FILE).read_text()
    assert lineage.count("| 4 |") == 2 and lineage.count("| 8 |") == 2


_RECORDS = {
    "a": [
        {"step": 0, "kind": "pbt", "optim.learning_rate": 0.1, "copied_from": -1},
        {"step": 4, "kind": "pbt", "optim.learning_rate": 2.5, "copied_from": 1, "score": 3.0},
        {"step": 8, "kind": "final_eval", "loss": 1.5},
    ],
    "b": [
        {"step": 0, "kind": "pbt", "optim.learning_rate": 2.0, "copied_from": -1},
        {"step": 4, "kind": "pbt", "optim.learning_rate": 2.0, "copied_from": -1, "score": 2.0},
        {"step": 8, "kind": "final_eval", "loss": 1.0},
    ],
}


def test_the_pbt_picture_collects_each_trials_schedule_copies_and_final_score():
    from experiments import pbt_plot

    series = pbt_plot.schedules(_RECORDS)
    assert series == {
        "optim.learning_rate": {
            "a": ([0, 4, 8], [0.1, 2.5, 2.5], [4]),
            "b": ([0, 4, 8], [2.0, 2.0, 2.0], []),
        }
    }
    assert pbt_plot.final_scores(_RECORDS, "loss") == {"a": 1.5, "b": 1.0}
    assert pbt_plot.schedules({"plain": [{"step": 8, "kind": "final_eval", "loss": 1.0}]}) == {}


def test_the_pbt_picture_draws_the_schedules_coloured_by_final_score(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from experiments import pbt_plot

    figures = []
    original = pbt_plot.canvas.new_figure
    monkeypatch.setattr(
        pbt_plot.canvas, "new_figure", lambda *a: figures.append(original(*a)) or figures[-1]
    )
    path = pbt_plot.draw_pbt(_RECORDS, tmp_path / "pbt.png")
    assert path.exists()
    lines = figures[0].axes[0].get_lines()
    steps = {tuple(line.get_ydata()): line.get_color() for line in lines}
    # a (worse final loss 1.5) is the top of viridis, b (1.0) the bottom; a's copy is a dot.
    assert np.allclose(steps[(0.1, 2.5, 2.5)], pbt_plot._colormap()(1.0))
    assert np.allclose(steps[(2.0, 2.0, 2.0)], pbt_plot._colormap()(0.0))
    assert [tuple(line.get_xdata()) for line in lines if line.get_marker() == "o"] == [(4,), ()]


def test_the_sweep_summary_gets_each_pbt_groups_lineage(tmp_path):
    from experiments import sweep

    (tmp_path / "summary.md").write_text("| run |\n")
    sweep.group_directory(tmp_path, 1).mkdir()
    (sweep.group_directory(tmp_path, 1) / pbt.LINEAGE_FILE).write_text("| 4 | a | b |\n")
    sweep._add_pbt_lineage(tmp_path, 2)  # group 0 is not a PBT group
    assert (tmp_path / "summary.md").read_text() == (
        "| run |\n\n## Population-based training, group 2\n\n| 4 | a | b |\n"
    )


def test_the_lineage_table_names_the_trials():
    text = pbt.lineage_markdown(
        ["a", "b"], [{"step": 4, "trial": 0, "source": 1}], {"optim.learning_rate": [2.5, 2.0]}
    )
    assert text.splitlines() == [
        "| step | trial | copied |",
        "|---|---|---|",
        "| 4 | a | b |",
        "",
        "| trial | optim.learning_rate |",
        "|---|---|",
        "| a | 2.5 |",
        "| b | 2 |",
    ]


def test_act_ranks_on_the_metric_writes_the_live_trials_records_and_refuses_a_missing_one():
    """`pbt.act` on a stub group of three trials, trial 2 stopped: of the two live ones the
    worse (higher loss) copies the better, and only live trials get a "pbt" record."""
    settings = pbt.settings([_config(*PBT)])
    hyper = {"learning_rate": jnp.asarray([0.1, 0.2, 0.3], jnp.float32)}
    written = []
    writer = types.SimpleNamespace(write=lambda *a: written.append(a))
    hooks = types.SimpleNamespace(
        population=pbt.Population(settings, hyper),
        evaluated=(4, {0: {"loss": 2.0}, 1: {"loss": 1.0}}),
        group=types.SimpleNamespace(placement=vsweep_state.Placement(None, shared_batch=True)),
        status=["ok", "ok", "frozen at step 2 (non-finite loss)"],
        writers=[writer] * 3,
    )
    state = vectorized.SweepState(train={"w": jnp.arange(3.0)}, live=jnp.ones(3, bool))
    state = pbt.act(hooks, state, 4)
    np.testing.assert_array_equal(state.train["w"], [1.0, 1.0, 2.0])
    assert hooks.population.lineage == [{"step": 4, "trial": 0, "source": 1}]
    assert [(a[0], a[1], a[2]["copied_from"], a[2]["score"]) for a in written] == [
        (4, "pbt", 1, 2.0),
        (4, "pbt", -1, 1.0),
    ]
    lr = np.float32(0.2)  # the copied trial's, times 0.8 or 1.25 in float32
    assert written[0][2]["optim.learning_rate"] in (lr * np.float32(0.8), lr * np.float32(1.25))
    hooks.population.settings = pbt.settings([_config(*PBT, "sweep.pbt.metric=bleu")])
    with pytest.raises(errors.ConfigError, match=r"sweep\.pbt\.metric='bleu' is not in the"):
        pbt.act(hooks, state, 8)
