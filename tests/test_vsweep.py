"""Vectorised sweeps (tfjax.runs.vsweep): each trial of one vmapped program equals the trial
trained alone; sharding, resume, NaN freezing, successive halving, extract, bad input.

The reference for "alone" is `experiments.train`'s loop in mode "sharded" (one jitted program,
like the sweep): mode "pmap" folds the device index into the dropout key, so its masks differ.
"""

import functools
import hashlib
import json
import math
import pathlib
import types

import jax
import numpy as np
import optax
import pytest
import test_workdir_format

from experiments import config_utils
from tfjax import errors, models
from tfjax.data import pipeline
from tfjax.runs import lock, restoration, trainer, vsweep, vsweep_state, workdir_format
from tfjax.training import checkpointing, logger, optim, steps, vectorized

SPEC = "configs/base.py:tiny"
STEPS = 8
RTOL, ATOL = 1e-5, 1e-5  # as tests/test_multihost.py: another reduction order, ~2e-6
COMMON = [
    "data.name=reverse",
    "data.num_train_examples=96",
    "data.num_eval_examples=8",
    "data.task_max_len=6",
    "data.max_source_len=8",
    "data.max_target_len=8",
    "model.dropout_rate=0.1",  # dropout on: each trial must draw its own masks
    # A key bias does not change attention (softmax is shift-invariant), so its gradient is
    # rounding noise that Adam scales up to full steps: it differs between any two programs.
    "model.use_bias=false",
    f"train.num_train_steps={STEPS}",
    "train.log_every_steps=2",
    "train.eval_every_steps=4",
    "train.checkpoint_every_steps=4",
    "train.keep_checkpoints=4",
]
# Four trials that differ in every kind of vectorised hyperparameter, two seeds among them
# (so two data orders and per-trial batches), three schedules, Adam and AdamW, clipping on one,
# two label smoothings and two pairs of dropout rates (then traced per trial).
TRIALS = {
    # Learning rates that train without amplifying rounding: Adam turns the noise in a near-zero
    # gradient into full steps, so a huge rate (the tiny preset's paper scale 1.0 peaks at 0.1
    # here) makes two reduction orders drift apart by more than 1e-5 in a few elements.
    "paper": ["optim.learning_rate=0.2"],
    "clip": [
        "optim.learning_rate=0.1",
        "optim.b2=0.99",
        "optim.grad_clip_norm=0.5",
        "train.label_smoothing=0.2",
    ],
    "adamw": [
        "optim.optimizer=adamw",
        "optim.weight_decay=0.1",
        "optim.schedule=constant",
        "optim.learning_rate=0.003",
        "optim.warmup_steps=3",
        "seed=1",
    ],
    "cosine": [
        "optim.schedule=cosine",
        "optim.learning_rate=0.004",
        "optim.warmup_steps=2",
        "optim.eps=1e-6",
        "optim.b1=0.8",
        "model.dropout_rate=0.3",
        "model.attention_dropout_rate=0.2",
        "seed=1",
    ],
}


def _config(*overrides):
    return config_utils.load_config(SPEC, [*COMMON, *overrides])


def _trials(root: pathlib.Path, trials=None, *extra):
    trials = TRIALS if trials is None else trials
    return [
        vsweep.Trial(name, _config(*overrides, *extra), root / name)
        for name, overrides in trials.items()
    ]


def _params(config, workdir):
    return jax.device_get(restoration.restore(config, workdir)[1].state.params)


def _extracted_params(trials, group_dir):
    out = {}
    for trial in trials:
        vsweep_state.extract(group_dir, trial.workdir)
        out[trial.name] = _params(trial.config, trial.workdir)
    return out


def _assert_close_trees(a, b):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL), a, b)


_COMPARED = ("loss", "nll", "accuracy", "grad_norm", "learning_rate")


def _metric_rows(workdir, kind):
    rows = logger.read_metrics(workdir, kind)
    return [(r["step"], [r[k] for k in _COMPARED if k in r]) for r in rows]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The four trials trained once vectorised (8 devices: trials 4 x data 2) and once each
    alone."""
    root = tmp_path_factory.mktemp("vsweep")
    trials = _trials(root / "sweep")
    outcomes = vsweep.train_trials(trials, root / "sweep" / "group")
    alone = {}
    for trial in trials:
        config = _config(*TRIALS[trial.name], "parallel.mode=sharded")
        trainer.train_and_evaluate(config, root / "alone" / trial.name)
        alone[trial.name] = _params(config, root / "alone" / trial.name)
    vectorised = _extracted_params(trials, root / "sweep" / "group")
    return {"root": root, "trials": trials, "outcomes": outcomes, "alone": alone, "vec": vectorised}


@pytest.mark.slow
def test_the_four_trials_are_one_group_on_a_trial_by_data_mesh(sweep):
    assert len(vsweep.group_trials(sweep["trials"])) == 1
    placement = vsweep_state.Placement.create(4, 8, shared_batch=False)
    assert dict(placement.mesh.shape) == {"trial": 4, "data": 2}
    assert [o.status for o in sweep["outcomes"]] == ["ok"] * 4


@pytest.mark.slow
def test_each_trial_ends_with_the_parameters_of_the_trial_trained_alone(sweep):
    for name in TRIALS:
        _assert_close_trees(sweep["vec"][name], sweep["alone"][name])
    # and the trials really differ from each other
    a, b = sweep["vec"]["paper"], sweep["vec"]["clip"]
    gaps = [float(np.abs(x - y).max()) for x, y in zip(*map(jax.tree.leaves, (a, b)), strict=True)]
    assert max(gaps) > 1e-4


@pytest.mark.slow
def test_each_trial_logs_the_metrics_of_the_trial_trained_alone(sweep):
    for name in TRIALS:
        vec_dir, alone_dir = sweep["root"] / "sweep" / name, sweep["root"] / "alone" / name
        for kind in ("startup", "train", "eval", "final_eval"):  # startup: steps alone
            vec, alone = _metric_rows(vec_dir, kind), _metric_rows(alone_dir, kind)
            assert [s for s, _ in vec] == [s for s, _ in alone] and vec, (name, kind)
            np.testing.assert_allclose([v for _, v in vec], [v for _, v in alone], rtol=1e-5)


@pytest.mark.slow
def test_each_trial_workdir_is_an_ordinary_run_with_hparams(sweep):
    for trial in sweep["trials"]:
        saved = json.loads((trial.workdir / "config.json").read_text())
        recorded = saved.pop("tokenizer_sha256")  # what a resumed group checks its tokenizer by
        assert saved == workdir_format.stamped(workdir_format.config_dict(trial.config))
        assert (trial.workdir / "tokenizer.json").exists() or list(trial.workdir.glob("*.model"))
        file = trial.workdir / "tokenizer.json"
        assert recorded == {"tokenizer.json": hashlib.sha256(file.read_bytes()).hexdigest()}
        assert list((trial.workdir / "tensorboard" / "hparams").glob("events.out.tfevents.*"))
    hparams = vsweep.hparams(sweep["trials"][2].config)
    assert hparams["optim.optimizer"] == "adamw" and hparams["seed"] == 1


@pytest.mark.slow
def test_an_extracted_trial_resumes_in_experiments_train(sweep, tmp_path):
    trial = sweep["trials"][0]
    config = _config(*TRIALS[trial.name], "train.num_train_steps=10", "parallel.mode=sharded")
    trainer.train_and_evaluate(config, trial.workdir)  # resumes at 8, trains 2 more
    assert logger.read_metrics(trial.workdir, "train")[-1]["step"] == 10
    longer = _config(*TRIALS[trial.name], "train.num_train_steps=10", "parallel.mode=sharded")
    trainer.train_and_evaluate(longer, tmp_path / "straight")
    # the paper schedule does not depend on num_train_steps: 10 straight steps are the same
    _assert_close_trees(_params(config, trial.workdir), _params(longer, tmp_path / "straight"))


@pytest.mark.slow
def test_a_sweep_without_a_mesh_equals_the_sharded_one(sweep, tmp_path, monkeypatch):
    monkeypatch.setattr(vsweep_state, "mesh_shape", lambda *args: (1, 1))
    trials = _trials(tmp_path)
    vsweep.train_trials(trials, tmp_path / "group")
    for name, params in _extracted_params(trials, tmp_path / "group").items():
        _assert_close_trees(params, sweep["vec"][name])


@pytest.mark.slow
def test_a_killed_sweep_resumes_to_the_same_result(sweep, tmp_path, monkeypatch):
    trials = _trials(tmp_path)
    original = pipeline.BatchIterator.__next__
    calls = {"n": 0}

    def crash_after_six_steps(self):  # two seeds: two iterators, two calls per step
        calls["n"] += 1
        if calls["n"] > 2 * 6:
            raise KeyboardInterrupt("simulated kill")
        return original(self)

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", crash_after_six_steps)
    with pytest.raises(KeyboardInterrupt):
        vsweep.train_trials(trials, tmp_path / "group")
    monkeypatch.setattr(pipeline.BatchIterator, "__next__", original)
    assert lock.read_holder(tmp_path / "group") is None
    vsweep.train_trials(trials, tmp_path / "group")  # restores step 4, replays 5..8
    for name, params in _extracted_params(trials, tmp_path / "group").items():
        jax.tree.map(np.testing.assert_array_equal, params, sweep["vec"][name])


@pytest.mark.slow
def test_a_trial_whose_loss_goes_nan_is_frozen_and_the_others_go_on(sweep, tmp_path):
    trials = _trials(
        tmp_path,
        {
            "paper": TRIALS["paper"],
            "nan": ["optim.schedule=constant", "optim.learning_rate=1e30", "optim.warmup_steps=0"],
        },
    )
    outcomes = vsweep.train_trials(trials, tmp_path / "group")
    assert outcomes[0].status == "ok"
    assert outcomes[1].status.startswith("frozen at step ") and "non-finite" in outcomes[1].status
    frozen_at = int(outcomes[1].status.split()[3])
    params = _extracted_params(trials, tmp_path / "group")
    _assert_close_trees(params["paper"], sweep["vec"]["paper"])
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params["nan"]))
    steps = [r["step"] for r in logger.read_metrics(tmp_path / "nan", "train")]
    assert all(step < frozen_at for step in steps)  # no train record after the freeze


@pytest.mark.slow
def test_successive_halving_stops_the_worse_half_at_the_given_step(tmp_path):
    trials = _trials(tmp_path, None, "sweep.halving_steps=4", "train.eval_every_steps=4")
    outcomes = vsweep.train_trials(trials, tmp_path / "group")
    stopped = [o for o in outcomes if o.status.startswith("stopped at step 4")]
    assert len(stopped) == 2 and sum(o.status == "ok" for o in outcomes) == 2
    # The evaluation at step 4 (before the halving, on the same examples) ranks the trials:
    # the two with the higher eval loss are the ones stopped, each with its loss.
    eval_loss = {t.name: logger.read_metrics(t.workdir, "eval")[0]["loss"] for t in trials}
    ranked = sorted(eval_loss, key=eval_loss.get)
    statuses = {t.name: o.status for t, o in zip(trials, outcomes, strict=True)}
    assert [statuses[name] for name in ranked[:2]] == ["ok", "ok"]
    for name in ranked[2:]:
        assert statuses[name] == (
            f"stopped at step 4 (successive halving, eval loss {eval_loss[name]:.4g})"
        )
    for trial, outcome in zip(trials, outcomes, strict=True):
        last = logger.read_metrics(trial.workdir, "train")[-1]["step"]
        assert last == (4 if outcome.status != "ok" else STEPS)


def test_mesh_shape_spreads_trials_then_data():
    assert vsweep_state.mesh_shape(16, 8, 64) == (8, 1)
    assert vsweep_state.mesh_shape(4, 8, 64) == (4, 2)
    assert vsweep_state.mesh_shape(3, 8, 64) == (1, 8)
    assert vsweep_state.mesh_shape(4, 8, 6) == (4, 2)
    assert vsweep_state.mesh_shape(1, 8, 3) == (1, 1)


def test_trials_of_different_shapes_split_into_groups_and_are_refused_together(tmp_path):
    trials = _trials(
        tmp_path,
        {"a": ["model.num_layers=1"], "b": ["model.num_layers=2"], "c": ["model.num_layers=1"]},
    )
    groups = vsweep.group_trials(trials)
    assert [[t.name for t in g] for g in groups] == [["a", "c"], ["b"]]
    assert vsweep.splitting_keys(trials) == ["model.num_layers"]
    accumulation = _trials(tmp_path, {"a": [], "b": ["optim.grad_accum_steps=2"]})
    assert vsweep.splitting_keys(accumulation) == ["optim.grad_accum_steps"]
    with pytest.raises(errors.ConfigError, match=r"differ in model\.num_layers.*cannot be vect"):
        vsweep.train_trials(trials, tmp_path / "group")


def test_bad_sweeps_are_one_line_errors(tmp_path):
    with pytest.raises(errors.ConfigError, match=r"parallel\.fsdp=1"):
        fsdp = {"a": ["parallel.mode=sharded", "parallel.fsdp=2"]}
        vsweep.train_trials(_trials(tmp_path, fsdp), tmp_path / "g")
    with pytest.raises(errors.ConfigError, match=r"sweep\.halving_steps must be"):
        vsweep.train_trials(_trials(tmp_path, {"a": ["sweep.halving_steps=0"]}), tmp_path / "g")
    with pytest.raises(errors.ConfigError, match="unique"):
        vsweep.train_trials([*_trials(tmp_path, {"a": []})] * 2, tmp_path / "g")
    with pytest.raises(errors.ConfigError, match="does not run the masked-LM objective"):
        mlm = {"a": ["model.kind=encoder_only", "model.encoder_head=mlm"]}
        vsweep.train_trials(_trials(tmp_path, mlm), tmp_path / "g")
    (tmp_path / "a").mkdir(exist_ok=True)
    workdir_format.write_config_json(tmp_path / "a", _config())
    with pytest.raises(errors.CheckpointError, match="run the vectorised sweep first"):
        vsweep_state.extract(tmp_path / "nothing", tmp_path / "a")


@pytest.mark.slow
def test_another_sweeps_directory_and_a_stranger_workdir_are_refused(sweep, tmp_path):
    other = _trials(tmp_path, {"x": [], "y": []})
    with pytest.raises(errors.CheckpointError, match="use another --workdir"):
        vsweep.train_trials(other, sweep["root"] / "sweep" / "group")
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    workdir_format.write_config_json(stranger, _config("seed=7"))
    with pytest.raises(errors.CheckpointError, match="is not a trial of the sweep"):
        vsweep_state.extract(sweep["root"] / "sweep" / "group", stranger)


# -- the traced optimizer against make_optimizer, and freezing, without a model ------------


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"schedule": "rsqrt", "learning_rate": 0.01, "warmup_steps": 3},
        {"schedule": "cosine", "learning_rate": 0.01, "warmup_steps": 2, "decay_steps": 6},
        {
            "schedule": "cosine",
            "learning_rate": 0.01,
            "warmup_steps": 0,
            "decay_steps": 6,
            "end_lr_fraction": 0.1,
        },
        {"schedule": "constant", "learning_rate": 0.02, "warmup_steps": 0},
        {
            "optimizer": "adamw",
            "weight_decay": 0.3,
            "schedule": "constant",
            "learning_rate": 0.1,
            "warmup_steps": 2,
        },
        {"grad_clip_norm": 0.05, "b1": 0.5, "b2": 0.9, "eps": 1e-3, "warmup_steps": 2},
        {"grad_accum_steps": 2, "warmup_steps": 2},
    ],
)
def test_traced_optimizer_updates_equal_make_optimizer(fields):
    mixed = optim.OptimConfig(
        optimizer="adamw",
        grad_clip_norm=1.0,
        schedule="constant",
        learning_rate=1e-3,
        warmup_steps=0,
        grad_accum_steps=fields.get("grad_accum_steps", 1),
    )
    config = optim.OptimConfig(**fields)
    structure = optim.traced_structure([mixed, config])  # adamw and clipping for both
    hyper = optim.traced_hyper(config, structure)
    reference, ref_schedule = optim.make_optimizer(config, d_model=16)
    traced, schedule = optim.traced_optimizer(hyper, structure, 16)
    params = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    ref_state, state = reference.init(params), traced.init(params)
    for step in range(6):
        grads = {"w": np.cos(np.arange(12, dtype=np.float32) * (step + 1)).reshape(3, 4)}
        ref_updates, ref_state = reference.update(grads, ref_state, params)
        updates, state = jax.jit(traced.update)(grads, state, params)
        np.testing.assert_allclose(updates["w"], ref_updates["w"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(schedule(step), ref_schedule(step), rtol=1e-6)
        params = optax.apply_updates(params, ref_updates)


def test_traced_structure_refuses_a_field_that_cannot_be_vectorised():
    a = optim.OptimConfig(grad_accum_steps=1)
    b = optim.OptimConfig(grad_accum_steps=2)
    with pytest.raises(errors.ConfigError, match="grad_accum_steps differs"):
        optim.traced_structure([a, b])


def test_freeze_and_stack_round_trip():
    trees = [{"a": np.full(3, i, np.float32)} for i in range(4)]
    stacked = vectorized.stack(trees)
    assert stacked["a"].shape == (4, 3)
    np.testing.assert_array_equal(vectorized.unstack(stacked, 2)["a"], trees[2]["a"])
    state = vectorized.SweepState(train=stacked, live=np.array([True, True, False, True]))
    frozen = vectorized.freeze(state, np.array([True, False, False, False]))
    np.testing.assert_array_equal(frozen.live, [False, True, False, True])
    assert math.isfinite(float(np.sum(stacked["a"])))


# -- experiments.sweep: --vectorize, groups, --extract --------------------------------------


def test_run_vectorized_trains_groups_in_turn_and_keeps_the_sweep_order(
    tmp_path, monkeypatch, capsys
):
    from experiments import sweep as sweep_cli
    from experiments import sweep_runs

    sweep = [{"model.num_layers": 1}, {"model.num_layers": 2}, {"model.num_layers": 1, "seed": 3}]
    runs = [
        sweep_runs.Run(
            name,
            tmp_path / name,
            overrides,
            [],
            _config(*(f"{k}={v}" for k, v in overrides.items())),
        )
        for name, overrides in zip(("a", "b", "c"), sweep, strict=True)
    ]
    trained = []

    def fake_train(trials, directory):
        trained.append(([t.name for t in trials], directory.name))
        if len(trials) == 1:
            raise errors.ConfigError("bad value")
        return [vsweep.Outcome("ok", {}), vsweep.Outcome("frozen at step 3 (non-finite loss)", {})]

    monkeypatch.setattr(vsweep, "train_trials", fake_train)
    rows = sweep_cli.run_vectorized(runs, tmp_path)
    assert trained == [(["a", "c"], "_vectorized-0"), (["b"], "_vectorized-1")]
    assert [r["run"] for r in rows] == ["a", "b", "c"]
    assert [r["status"] for r in rows] == [
        "ok",
        "failed (bad value)",
        "frozen at step 3 (non-finite loss)",
    ]
    assert sweep_cli.sweep_summary.failed(rows) == ["b", "c"]
    assert "differ in model.num_layers" in capsys.readouterr().out
    assert (tmp_path / "summary.md").read_text().count("\n") == 5  # header, rule, 3 rows


@pytest.mark.slow
def test_vectorize_extract_and_evaluate_from_the_command_line(tmp_path):
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    common = [f"--config.{o}" for o in COMMON]
    sweep = [
        sys.executable,
        "-m",
        "experiments.sweep",
        f"--config={SPEC}",
        "--sweep=lr",
        f"--workdir={tmp_path}",
        *common,
    ]

    def run(*argv):
        return subprocess.run(
            argv, cwd=root, capture_output=True, text=True, timeout=600, check=False
        )

    result = run(*sweep, "--vectorize", "--plot")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[group 1/1] 3 trials: lr0.5, lr1.0, lr2.0" in result.stdout
    summary = (tmp_path / "lr" / "summary.md").read_text()
    assert summary.count("| ok |") == 3
    assert (tmp_path / "lr" / "curves.png").exists()
    result = run(*sweep, "--extract=lr1.0")
    assert result.returncode == 0 and "wrote step 8 of lr1.0" in result.stdout, result.stderr[
        -2000:
    ]
    evaluated = run(
        sys.executable, "-m", "experiments.evaluate", f"--workdir={tmp_path / 'lr' / 'lr1.0'}"
    )
    assert evaluated.returncode == 0 and "greedy_exact_match" in evaluated.stdout, evaluated.stderr[
        -2000:
    ]
    unknown = run(*sweep, "--extract=lr9")
    assert (
        unknown.returncode == 2
        and "error: --extract=lr9: the sweep has no run of that name" in unknown.stderr
    )


def test_a_traced_label_smoothing_gives_the_loss_and_gradient_of_the_static_one():
    from tfjax.nn import losses

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    targets = jax.numpy.asarray(rng.integers(0, 7, (2, 5)), np.int32)
    weights = jax.numpy.asarray(rng.random((2, 5)) > 0.2, np.float32)

    def loss(z, eps):
        return losses.cross_entropy(z, targets, weights, label_smoothing=eps)

    values = (0.0, 0.1, 0.4)
    traced = jax.jit(jax.vmap(jax.value_and_grad(lambda z, e: loss(z, e)[0]), (None, 0)))
    traced_loss, traced_grad = traced(logits, np.array(values, np.float32))
    for i, eps in enumerate(values):
        static_loss, static_grad = jax.value_and_grad(lambda z, e=eps: loss(z, e)[0])(logits)
        np.testing.assert_allclose(traced_loss[i], static_loss, rtol=1e-6)
        np.testing.assert_allclose(traced_grad[i], static_grad, rtol=1e-5, atol=1e-7)
        # and against the formula: -Σ w Σ_v q_v log p_v minus the targets' entropy
        logp = jax.nn.log_softmax(logits)
        q = np.full(logits.shape, eps / 6) + np.eye(7)[targets] * (1 - eps - eps / 6)
        entropy = -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1)), 0), -1)
        expected = np.sum(weights * (-np.sum(q * logp, -1) - entropy))
        np.testing.assert_allclose(traced_loss[i], expected, rtol=1e-5)


def test_dropout_with_a_traced_rate_draws_the_masks_of_the_static_rate():
    import flax.linen as nn

    from tfjax.nn import layers

    x = jax.numpy.ones((4, 64), np.float32)
    key = jax.random.key(3)

    def drop(rate, module=layers.Dropout):
        return module(rate).apply({}, x, deterministic=False, rngs={"dropout": key})

    traced = jax.jit(jax.vmap(drop))(np.array([0.0, 0.25, 0.5], np.float32))
    for i, rate in enumerate((0.0, 0.25, 0.5)):
        flax_masks = drop(rate, nn.Dropout)  # the reference: flax's own dropout
        np.testing.assert_allclose(traced[i], flax_masks, rtol=1e-6)
        np.testing.assert_array_equal(drop(rate), flax_masks)
    assert 0.35 < float(np.mean(traced[2] == 0)) < 0.65


def test_dropout_with_a_traced_rate_keeps_a_bf16_input_in_bf16():
    """A traced rate is a float32 scalar: dividing by it must not promote a bf16 activation."""
    from tfjax.nn import layers

    x = jax.numpy.full((2, 32), 2.0, jax.numpy.bfloat16)

    def drop(rate):
        return layers.Dropout(rate).apply(
            {}, x, deterministic=False, rngs={"dropout": jax.random.key(5)}
        )

    traced = jax.jit(jax.vmap(drop))(np.array([0.0, 0.5], np.float32))
    assert traced.dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(traced[1], drop(0.5))
    assert set(np.unique(np.asarray(traced[1], np.float32))) <= {0.0, 4.0}


def test_extract_finds_the_trial_and_refuses_a_group_saved_before_new_model_options(tmp_path):
    full = workdir_format.config_dict(config_utils.load_config("configs/base.py:tiny", []))
    other = json.loads(json.dumps(full))
    other["seed"] = 7
    trials = [{"name": "other", "config": other}, {"name": "it", "config": full}]
    assert vsweep_state._trial_index(trials, full, "w", "d") == 1
    with pytest.raises(errors.CheckpointError, match="matches none of"):
        vsweep_state._trial_index(trials[:1], full, "w", "d")
    older = json.loads(json.dumps(full))
    del older["model"]["final_dropout"]  # the sweep ran before the option existed
    copy = tmp_path / "checkpoints" / "3" / checkpointing.CONFIG_COPY
    copy.parent.mkdir(parents=True)
    test_workdir_format.write_older(copy, {"trials": [{"name": "it", "config": older}]})
    with pytest.raises(errors.WorkdirError, match=r"written by tfjax 0\.2\.0 or earlier") as raised:
        vsweep_state.check_trial_names(tmp_path, [types.SimpleNamespace(name="it")])
    assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_a_trial_trained_without_eos_equals_the_trial_trained_alone(tmp_path):
    """`train.predict_eos=False` reaches the vectorised step and eval step: parameters and
    logged metrics are those of the same run alone (which differ from an EOS-predicting run's)."""
    overrides = ["optim.learning_rate=0.2", "train.predict_eos=false"]
    trials = [vsweep.Trial("noeos", _config(*overrides), tmp_path / "sweep" / "noeos")]
    vsweep.train_trials(trials, tmp_path / "sweep" / "group")
    vec = _extracted_params(trials, tmp_path / "sweep" / "group")["noeos"]
    for predict_eos in ("false", "true"):
        config = _config(
            *overrides[:1], f"train.predict_eos={predict_eos}", "parallel.mode=sharded"
        )
        trainer.train_and_evaluate(config, tmp_path / predict_eos)
    _assert_close_trees(vec, _params(_config(*overrides), tmp_path / "false"))
    other = _params(_config(*overrides[:1]), tmp_path / "true")
    gaps = [
        float(np.abs(a - b).max()) for a, b in zip(*map(jax.tree.leaves, (vec, other)), strict=True)
    ]
    assert max(gaps) > 1e-4
    for kind in ("train", "eval", "final_eval"):
        rows = _metric_rows(tmp_path / "sweep" / "noeos", kind)
        alone = _metric_rows(tmp_path / "false", kind)
        assert [s for s, _ in rows] == [s for s, _ in alone] and rows, kind
        np.testing.assert_allclose([v for _, v in rows], [v for _, v in alone], rtol=1e-5)


def test_two_trials_differing_in_learning_rate_each_take_their_own_step():
    """One vectorised step of two trials that differ only in the learning rate equals each
    trial's own `steps.make_train_step` step (a tiny decoder-only model, no dropout)."""
    # Compiling dominates on a CPU; XLA's backend optimisation level 0 cuts it.
    jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    config = models.ModelConfig(
        kind="decoder_only",
        vocab_size=11,
        embed_dim=8,
        num_layers=1,
        num_heads=2,
        mlp_dim=16,
        max_len=8,
        dropout_rate=0.0,
        use_bias=False,  # a key bias's gradient is rounding noise that Adam makes a full step
    )
    model = models.create_model(config)
    targets = np.random.default_rng(0).integers(3, 11, (2, 6)).astype(np.int32)
    batch = {"targets": targets, "targets_segment_ids": np.ones((2, 6), np.int32)}
    params = jit(model.init)(jax.random.key(0), targets)["params"]
    rng = jax.random.key(1)
    configs = [
        optim.OptimConfig(schedule="constant", learning_rate=lr, warmup_steps=0)
        for lr in (0.01, 0.03)
    ]

    def alone(config_):
        optimizer, schedule = optim.make_optimizer(config_, d_model=8)
        step = steps.make_train_step(
            model, optimizer, schedule, kind="decoder_only", label_smoothing=0.0
        )

        def run(params, batch, rng):
            state = steps.TrainState(
                step=jax.numpy.zeros((), np.int32), params=params, opt_state=optimizer.init(params)
            )
            return step(state, batch, rng)

        return jit(run)(params, batch, rng)

    structure = optim.traced_structure(configs)
    hyper = jax.tree.map(
        lambda *x: np.stack(x), *[optim.traced_hyper(c, structure) for c in configs]
    )
    vstep = vectorized.make_vectorized_train_step(
        model, structure, d_model=8, kind="decoder_only", label_smoothing=0.0, shared_batch=True
    )

    def together(params, batch, rng, hyper):
        traced, _ = optim.traced_optimizer(vectorized.unstack(hyper, 0), structure, 8)
        init = steps.TrainState(
            step=jax.numpy.zeros((), np.int32), params=params, opt_state=traced.init(params)
        )
        state = vectorized.SweepState(train=vectorized.stack([init, init]), live=np.ones(2, bool))
        return vstep(state, batch, jax.numpy.stack([rng, rng]), hyper)

    new, metrics = jax.device_get(jit(together)(params, batch, rng, hyper))  # numpy
    singles = [alone(c) for c in configs]
    for i, (single_state, single_metrics) in enumerate(singles):
        np.testing.assert_allclose(metrics["learning_rate"][i], configs[i].learning_rate)
        np.testing.assert_allclose(single_metrics["learning_rate"], configs[i].learning_rate)
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
            vectorized.unstack(new.train.params, i),
            single_state.params,
        )
    # The two rates move the parameters apart: the check above tells them apart.
    gaps = jax.tree.map(
        lambda a, b: np.abs(a - b).max(), singles[0][0].params, singles[1][0].params
    )
    assert max(jax.tree.leaves(gaps)) > 1e-3


# -- SIGTERM, a second sweep, metrics after a resume ------------------------------------------


@pytest.fixture
def sigterm_caught():
    """A SIGTERM handler that only counts, for the tests that send one to this process: one the
    sweep forgot to catch must not end pytest. The handler before is given back after."""
    import signal

    caught = []
    previous = signal.signal(signal.SIGTERM, lambda *_: caught.append(1))
    yield caught
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_before_the_first_step_stops_the_group_saving_nothing(
    tmp_path, monkeypatch, sigterm_caught
):
    import os
    import signal

    trials = _trials(tmp_path, {"a": [], "b": ["optim.learning_rate=0.5"]})
    original = vsweep_state.load_examples

    def terminated_while_loading(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # the group's handler raises right here
        return original(*args)

    monkeypatch.setattr(vsweep_state, "load_examples", terminated_while_loading)
    previous = signal.getsignal(signal.SIGTERM)
    outcomes = vsweep.train_trials(trials, tmp_path / "group")
    assert [o.status for o in outcomes] == ["preempted before its first step"] * 2
    assert signal.getsignal(signal.SIGTERM) is previous and not sigterm_caught  # given back
    assert not (tmp_path / "group" / "checkpoints").exists()
    assert lock.read_holder(tmp_path / "group") is None


def test_a_resumed_group_refuses_a_missing_tokenizer_never_rebuilds_it(tmp_path):
    """The group's checkpoints live in its own directory, not in the trials' workdirs."""
    trials = _trials(tmp_path, {"a": [], "b": ["optim.learning_rate=0.5"]})
    (tmp_path / "group" / "checkpoints" / "4").mkdir(parents=True)  # a group trained to step 4
    with pytest.raises(errors.DataError, match=r"tokenizer\.json is missing, but the checkpoints"):
        vsweep.train_trials(trials, tmp_path / "group")
    assert not list(tmp_path.glob("*/tokenizer.json"))


def test_a_resumed_group_drops_the_records_it_logs_again(tmp_path):
    loop = object.__new__(vsweep._GroupHooks)  # only its writers: no model is built
    loop.writers = [logger.MetricWriter(tmp_path / name) for name in ("a", "b")]
    for writer in loop.writers:
        writer.write(1, "startup", {"compile_seconds": 1.0})
        for step in (2, 4, 6):  # killed after logging step 6; the checkpoint is step 4
            writer.write(step, "train", {"loss": 1.0 / step})
        writer.close()
    loop._drop_replayed(4)
    for name in ("a", "b"):
        records = logger.read_metrics(tmp_path / name)
        assert [(r["step"], r["kind"]) for r in records] == [
            (1, "startup"),
            (2, "train"),
            (4, "train"),
        ]


def test_a_preempted_group_stops_the_sweep_and_a_busy_root_writes_nothing(tmp_path, monkeypatch):
    from experiments import sweep as sweep_cli
    from experiments import sweep_runs

    sweep = [{"model.num_layers": 1}, {"model.num_layers": 2}, {"model.num_layers": 1, "seed": 3}]
    runs = [
        sweep_runs.Run(
            name,
            tmp_path / "lr" / name,
            overrides,
            [],
            _config(*(f"{k}={v}" for k, v in overrides.items())),
        )
        for name, overrides in zip(("a", "b", "c"), sweep, strict=True)
    ]
    trained = []

    def preempted(trials, directory):
        trained.append([t.name for t in trials])
        return [vsweep.Outcome("preempted at step 6", {}) for _ in trials]

    monkeypatch.setattr(vsweep, "train_trials", preempted)
    (tmp_path / "lr").mkdir()
    with lock.WorkdirLock(tmp_path / "lr"):  # a sweep running there
        with pytest.raises(errors.WorkdirLockedError, match="is in use by another"):
            sweep_cli.run_sweep(runs, tmp_path / "lr", vectorize=True)
    assert trained == [] and not (tmp_path / "lr" / "summary.md").exists()
    assert not any(p.is_dir() for p in (tmp_path / "lr").iterdir())  # no group directory
    rows = sweep_cli.run_sweep(runs, tmp_path / "lr", vectorize=True)
    assert trained == [["a", "c"]]  # the second group did not start
    assert [(r["run"], r["status"]) for r in rows] == [
        ("a", "preempted at step 6"),
        ("b", "preempted (not started)"),
        ("c", "preempted at step 6"),
    ]
    assert sweep_cli.sweep_summary.failed(rows) == []
    assert (tmp_path / "lr" / "summary.md").read_text().count("| preempted") == 3


@pytest.mark.slow
def test_sigterm_saves_and_stops_and_a_rerun_after_a_kill_logs_each_step_once(
    tmp_path, monkeypatch, sigterm_caught
):
    import os
    import signal

    trials = _trials(tmp_path, {"a": [], "b": ["optim.learning_rate=0.5"]})  # one seed
    original = pipeline.BatchIterator.__next__
    calls = {"n": 0, "at": 0, "do": None}

    def next_batch(self):  # one seed: one call per step
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            calls["do"]()
        return original(self)

    def kill():
        raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(pipeline.BatchIterator, "__next__", next_batch)
    calls.update(at=3, do=lambda: os.kill(os.getpid(), signal.SIGTERM))
    outcomes = vsweep.train_trials(trials, tmp_path / "group")
    assert [o.status for o in outcomes] == ["preempted at step 3"] * 2 and not sigterm_caught
    checkpoints = tmp_path / "group" / "checkpoints"
    assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [3]
    calls.update(n=0, at=4, do=kill)  # steps 4 (saved), 5, 6 (logged); killed in step 7
    with pytest.raises(KeyboardInterrupt):
        vsweep.train_trials(trials, tmp_path / "group")
    calls.update(at=0)
    outcomes = vsweep.train_trials(trials, tmp_path / "group")  # restores 4, logs 6 again
    assert [o.status for o in outcomes] == ["ok", "ok"]
    for trial in trials:
        records = [(r["step"], r["kind"]) for r in logger.read_metrics(trial.workdir)]
        assert len(records) == len(set(records)), records
        train = [step for step, kind in records if kind == "train"]
        assert train == [2, 4, 6, 8]


@pytest.mark.slow
def test_a_second_sweep_is_refused_and_sigterm_ends_the_first_with_status_0(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root = pathlib.Path(__file__).resolve().parents[1]
    endless = ["train.num_train_steps=100000", "train.eval_every_steps=0"]
    command = [
        sys.executable,
        "-m",
        "experiments.sweep",
        f"--config={SPEC}",
        "--sweep=lr",
        f"--workdir={tmp_path}",
        "--vectorize",
        *(f"--config.{o}" for o in [*COMMON, *endless]),
    ]
    first = subprocess.Popen(
        command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not logger.read_metrics(tmp_path / "lr" / "lr0.5", "train"):
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.2)
        second = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2
        assert second.stderr.splitlines() == [second.stderr.splitlines()[0]]
        assert f"error: workdir {tmp_path / 'lr'} is in use by another" in second.stderr
        assert not (tmp_path / "lr" / "summary.md").exists()  # nothing written
        first.send_signal(signal.SIGTERM)
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr and "by SIGTERM; rerun the same command" in stderr
    assert "(0 ok, 0 failed, 3 preempted)" in stdout
    summary = (tmp_path / "lr" / "summary.md").read_text()
    assert summary.count("| preempted at step ") == 3


def test_successive_halving_stops_the_trials_with_the_higher_eval_loss(monkeypatch):
    """`_GroupHooks._halve` on five trials, one frozen before: of the four live ones it keeps the
    two with the lowest eval loss and stops the others, a non-finite loss counting as the worst.
    Each trial's eval loss is its one parameter (the evaluation is a stub)."""
    from tfjax.runs import evaluator

    losses = [0.9, 0.3, 0.1, float("nan"), 0.5]  # trial 2 is frozen already: not ranked
    monkeypatch.setattr(evaluator, "evaluate", lambda run, params, **_: {"loss": float(params)})
    loop = object.__new__(vsweep._GroupHooks)
    loop.group = types.SimpleNamespace(
        placement=vsweep_state.Placement(None, shared_batch=True),
        runs=[None] * 5,
        trials=[types.SimpleNamespace(name=f"t{i}") for i in range(5)],
    )
    loop.tcfg = types.SimpleNamespace(max_eval_examples=0)
    loop.status = ["ok", "ok", "frozen at step 2 (non-finite loss)", "ok", "ok"]
    state = vectorized.SweepState(
        train=types.SimpleNamespace(params=np.array(losses, np.float32)),
        live=np.array([True, True, False, True, True]),
    )
    halved = loop._halve(state, 4)
    assert loop.status[1] == loop.status[4] == "ok"
    assert loop.status[0] == "stopped at step 4 (successive halving, eval loss 0.9)"
    assert loop.status[3] == "stopped at step 4 (successive halving, eval loss nan)"
    np.testing.assert_array_equal(halved.live, [False, True, False, False, True])


def test_a_judge_sees_each_live_trials_evaluation_and_stops_those_it_names(monkeypatch):
    """`_GroupHooks.evaluate` hands the judge (a search's pruner) the eval record of each live
    trial; the next `adjust` stops the trials it named, once. The evaluation is a stub: each
    trial's eval loss is its one parameter."""
    from tfjax.runs import evaluator

    monkeypatch.setattr(evaluator, "evaluate", lambda run, params, **_: {"loss": float(params)})
    seen = []

    def judge(step, results):
        seen.append((step, {i: r["loss"] for i, r in results.items()}))
        return {0: "pruned, eval loss 0.9"}

    loop = object.__new__(vsweep._GroupHooks)
    loop.group = types.SimpleNamespace(
        placement=vsweep_state.Placement(None, shared_batch=True),
        runs=[None] * 3,
        trials=[types.SimpleNamespace(name=f"t{i}") for i in range(3)],
        judge=judge,
    )
    loop.tcfg = types.SimpleNamespace(max_eval_examples=0)
    loop.writers = [types.SimpleNamespace(write=lambda *record: None)] * 3
    loop.status = ["ok", "frozen at step 2 (non-finite loss)", "ok"]
    loop.halving, loop.judged, loop.population = [], {}, None
    state = vectorized.SweepState(
        train=types.SimpleNamespace(params=np.array([0.9, 0.5, 0.1], np.float32)),
        live=np.array([True, False, True]),
    )
    loop.evaluate(state, 4)
    assert seen == [(4, {0: pytest.approx(0.9), 2: pytest.approx(0.1)})]
    adjusted = loop.adjust(state, 4)
    assert loop.status == [
        "stopped at step 4 (pruned, eval loss 0.9)",
        "frozen at step 2 (non-finite loss)",
        "ok",
    ]
    np.testing.assert_array_equal(adjusted.live, [False, False, True])
    assert loop.adjust(adjusted, 5) is adjusted  # told once: nothing more to stop
