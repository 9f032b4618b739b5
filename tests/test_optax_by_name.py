"""Any optax optimizer by name from the config (`tfjax.training.optax_by_name`): trained from
overrides alone, one update against optax called directly and against Lion's formula, the
vectorised twin against single runs, and the one-line refusals."""

import functools
import json

import jax
import numpy as np
import optax
import pytest
import test_workdir_format
from tiny_runs import REVERSE

from experiments import config_utils
from tfjax import errors, models
from tfjax.runs import build, restoration, trainer, validation, workdir_format
from tfjax.training import logger, optim, steps, vectorized

# A constant learning rate: the first updates of a short run move the parameters.
CONSTANT = ("optim.schedule=constant", "optim.learning_rate=0.003", "optim.warmup_steps=0")


def _config(*overrides, spec="configs/base.py:tiny"):
    config = config_utils.load_config(spec, list(overrides))
    validation.check_config(config)  # as experiments.train does before anything else
    return config


def _params():
    """A kernel, which weight_decay_params="matrices" decays, and a bias, which it does not."""
    kernel = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)
    return {"dense": {"bias": np.array([0.5, -0.25, 2.0], np.float32), "kernel": kernel}}


def _grads(step: int):
    return jax.tree.map(
        lambda x: np.cos(np.arange(x.size, dtype=np.float32) * (step + 1)).reshape(x.shape),
        _params(),
    )


# -- trained from config overrides alone -----------------------------------------------------


@pytest.mark.parametrize(
    "name, kwargs, state_type",
    [
        ("lion", {"b1": 0.95, "b2": 0.98}, "ScaleByLionState"),
        pytest.param(
            "adafactor",
            {"decay_rate": 0.7, "min_dim_size_to_factor": 16},
            "FactoredState",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_an_optimizer_tfjax_never_names_trains_from_overrides_alone(
    name, kwargs, state_type, tmp_path
):
    """lion and adafactor appear nowhere in tfjax: config overrides alone train them, through
    load_config, check_config and train_and_evaluate as experiments.train does."""
    overrides = [f"optim.optimizer={name}", *(f"optim.kwargs.{k}={v}" for k, v in kwargs.items())]
    config = _config(*REVERSE, *CONSTANT, *overrides, "train.eval_every_steps=0")
    assert np.isfinite(trainer.train_and_evaluate(config, tmp_path)["loss"])
    saved = json.loads((tmp_path / "config.json").read_text())["optim"]
    assert (saved["optimizer"], saved["kwargs"]) == (name, kwargs)
    restored = restoration.restore(config, tmp_path)[1]
    types = {type(n).__name__ for n in jax.tree.leaves(restored.state.opt_state, is_leaf=_is_state)}
    assert restored.step == 2 and state_type in types, types


@pytest.mark.slow
def test_a_run_by_name_resumes_from_its_config_json(tmp_path):
    """The workdir's config.json gives the run back, kwargs included, and its checkpoint's
    optimizer state restores into it: two steps and one more equal three at once."""
    overrides = ["optim.optimizer=lion", "optim.kwargs.b1=0.95", "model.dropout_rate=0.0"]
    config = _config(*REVERSE, *CONSTANT, *overrides, "train.eval_every_steps=0")
    trainer.train_and_evaluate(config, tmp_path / "resumed")
    longer = config_utils.load_config(
        str(tmp_path / "resumed" / "config.json"), ["train.num_train_steps=3"]
    )
    assert build.optim_config(longer) == build.optim_config(config)
    trainer.train_and_evaluate(longer, tmp_path / "resumed")
    at_once = _config(
        *REVERSE, *CONSTANT, *overrides, "train.eval_every_steps=0", "train.num_train_steps=3"
    )
    trainer.train_and_evaluate(at_once, tmp_path / "at_once")
    resumed, direct = (restoration.restore(longer, tmp_path / d)[1] for d in ("resumed", "at_once"))
    assert resumed.step == direct.step == 3
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params, direct.state.params)


def _is_state(node) -> bool:
    return hasattr(node, "_fields")  # optax's states are NamedTuples


# -- one update against optax called directly, and against Lion's formula ------------------

# What `weight_decay_params="matrices"` decays in `_params`, written out.
_MATRICES = {"dense": {"bias": False, "kernel": True}}


@pytest.mark.parametrize(
    "fields, reference",
    [
        (
            {"optimizer": "lion", "kwargs": {"b1": 0.95}, "weight_decay": 0.1},
            lambda: optax.lion(0.003, b1=0.95, weight_decay=0.1),
        ),
        (  # weight decay 0 is off, whatever optax's default (lion's is 1e-3)
            {"optimizer": "lion", "grad_clip_norm": 0.5, "weight_decay_params": "matrices"},
            lambda: optax.chain(
                optax.clip_by_global_norm(0.5), optax.lion(0.003, weight_decay=0.0, mask=_MATRICES)
            ),
        ),
        (
            {"optimizer": "lion", "weight_decay": 0.2, "weight_decay_params": "matrices"},
            lambda: optax.lion(0.003, weight_decay=0.2, mask=_MATRICES),
        ),
        (
            {"optimizer": "adafactor", "kwargs": {"min_dim_size_to_factor": 2, "decay_rate": 0.7}},
            lambda: optax.adafactor(0.003, min_dim_size_to_factor=2, decay_rate=0.7),
        ),
        (
            {"optimizer": "sgd", "kwargs": {"momentum": 0.9, "nesterov": True}},
            lambda: optax.sgd(0.003, momentum=0.9, nesterov=True),
        ),
        (
            {"optimizer": "contrib.prodigy", "grad_accum_steps": 2},
            lambda: optax.MultiSteps(optax.contrib.prodigy(0.003), 2).gradient_transformation(),
        ),
    ],
)
def test_updates_of_an_optimizer_by_name_equal_optax_called_directly(fields, reference):
    constant = {"schedule": "constant", "learning_rate": 0.003, "warmup_steps": 0}
    optimizer, _ = optim.make_optimizer(optim.OptimConfig(**constant, **fields), d_model=8)
    expected = reference()
    params = ref_params = _params()
    state, ref_state = optimizer.init(params), expected.init(params)
    for step in range(3):
        updates, state = jax.jit(optimizer.update)(_grads(step), state, params)
        ref_updates, ref_state = expected.update(_grads(step), ref_state, ref_params)
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-9),
            updates,
            ref_updates,
        )
        params = optax.apply_updates(params, updates)
        ref_params = optax.apply_updates(ref_params, ref_updates)


def _lion_reference(grads, params, lr, b1, b2, decay):
    """Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2, in
    float64: each step's update -lr · (sign(b1·m + (1-b1)·g) + decay · p), then
    m ← b2·m + (1-b2)·g."""
    m = np.zeros_like(params, np.float64)
    p = params.astype(np.float64)
    updates = []
    for g in grads:
        update = -lr * (np.sign(b1 * m + (1 - b1) * g) + decay * p)
        m = b2 * m + (1 - b2) * g
        p = p + update
        updates.append(update)
    return updates


@pytest.mark.parametrize("weight_decay", [0.0, 0.5])
def test_lion_by_name_follows_the_paper(weight_decay):
    config = optim.OptimConfig(
        optimizer="lion",
        kwargs={"b1": 0.8, "b2": 0.9},
        schedule="constant",
        learning_rate=0.01,
        warmup_steps=0,
        weight_decay=weight_decay,
    )
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    params = {"w": np.linspace(-1, 1, 6, dtype=np.float32)}
    grads = [np.cos(np.arange(6, dtype=np.float32) * (k + 1)) * 1e-2 for k in range(3)]
    expected = _lion_reference(grads, params["w"], 0.01, 0.8, 0.9, weight_decay)
    state = optimizer.init(params)
    for g, want in zip(grads, expected, strict=True):
        updates, state = optimizer.update({"w": g}, state, params)
        np.testing.assert_allclose(updates["w"], want, rtol=1e-5, atol=1e-8)
        params = optax.apply_updates(params, updates)


# -- vectorised trials ------------------------------------------------------------------------


def _lion(b1: float, lr: float, weight_decay: float = 0.0, **fields) -> optim.OptimConfig:
    return optim.OptimConfig(
        optimizer="lion",
        kwargs={"b1": b1, "b2": 0.95},
        schedule="constant",
        learning_rate=lr,
        warmup_steps=0,
        weight_decay=weight_decay,
        **fields,
    )


def test_traced_lion_updates_equal_each_trials_own():
    configs = [_lion(0.9, 0.01, grad_clip_norm=0.3), _lion(0.5, 0.02, weight_decay=0.1)]
    structure = optim.traced_structure(configs)
    assert (structure.optimizer, structure.kwargs) == ("lion", (("b2", 0.95),))
    assert structure.traced_kwargs == ("b1",)
    for config in configs:
        reference, _ = optim.make_optimizer(config, d_model=8)
        traced, _ = optim.traced_optimizer(optim.traced_hyper(config, structure), structure, 8)
        params = ref_params = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
        state, ref_state = traced.init(params), reference.init(params)
        for step in range(4):
            grads = {"w": np.cos(np.arange(12, dtype=np.float32) * (step + 1)).reshape(3, 4)}
            updates, state = jax.jit(traced.update)(grads, state, params)
            ref_updates, ref_state = reference.update(grads, ref_state, ref_params)
            np.testing.assert_allclose(updates["w"], ref_updates["w"], rtol=1e-6, atol=1e-9)
            params = optax.apply_updates(params, updates)
            ref_params = optax.apply_updates(ref_params, ref_updates)


def test_two_lion_trials_differing_in_b1_each_take_their_own_vmapped_step():
    """One vectorised train step of two trials that differ in a kwarg of an optimizer by name
    (and the learning rate) equals each trial's own `steps.make_train_step` step."""
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
        use_bias=False,
    )
    model = models.create_model(config)
    targets = np.random.default_rng(0).integers(3, 11, (2, 6)).astype(np.int32)
    batch = {"targets": targets, "targets_segment_ids": np.ones((2, 6), np.int32)}
    params = jit(model.init)(jax.random.key(0), targets)["params"]
    rng = jax.random.key(1)
    configs = [_lion(0.9, 0.01), _lion(0.2, 0.03)]

    def alone(trial):
        optimizer, schedule = optim.make_optimizer(trial, d_model=8)
        step = steps.make_train_step(
            model, optimizer, schedule, kind="decoder_only", label_smoothing=0.0
        )

        def run(params, batch, rng):
            zero = jax.numpy.zeros((), np.int32)
            return step(steps.TrainState(zero, params, optimizer.init(params)), batch, rng)[0]

        return jit(run)(params, batch, rng)

    structure = optim.traced_structure(configs)
    hyper = vectorized.stack([optim.traced_hyper(c, structure) for c in configs])
    vstep = vectorized.make_vectorized_train_step(
        model, structure, d_model=8, kind="decoder_only", label_smoothing=0.0, shared_batch=True
    )

    def together(params, batch, rng, hyper):
        traced, _ = optim.traced_optimizer(vectorized.unstack(hyper, 0), structure, 8)
        zero = jax.numpy.zeros((), np.int32)
        init = steps.TrainState(zero, params, traced.init(params))
        state = vectorized.SweepState(train=vectorized.stack([init, init]), live=np.ones(2, bool))
        return vstep(state, batch, jax.numpy.stack([rng, rng]), hyper)[0]

    new = jax.device_get(jit(together)(params, batch, rng, hyper))
    singles = [jax.device_get(alone(c)) for c in configs]
    for i, single in enumerate(singles):
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
            vectorized.unstack(new.train.params, i),
            single.params,
        )
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), singles[0].params, singles[1].params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the two b1 give two different steps


@pytest.mark.slow
def test_a_vectorised_sweep_of_lion_trials_equals_each_trained_alone(tmp_path):
    """Two lion trials that differ in b1 and the learning rate train as one vmapped program
    (one group), and each ends with the parameters of the trial trained alone."""
    from tfjax.runs import vsweep, vsweep_state

    common = [*REVERSE, "train.num_train_steps=4", "train.eval_every_steps=0"]
    common += ["model.dropout_rate=0.1", "model.use_bias=false", "optim.optimizer=lion"]
    common += ["optim.schedule=constant", "optim.warmup_steps=0", "optim.kwargs.b2=0.95"]
    trials = {"a": ["optim.kwargs.b1=0.9", "optim.learning_rate=0.003"]}
    trials["b"] = ["optim.kwargs.b1=0.5", "optim.learning_rate=0.001", "seed=1"]
    runs = [
        vsweep.Trial(n, _config(*common, *o), tmp_path / "sweep" / n) for n, o in trials.items()
    ]
    assert len(vsweep.group_trials(runs)) == 1
    outcomes = vsweep.train_trials(runs, tmp_path / "sweep" / "group")
    assert [o.status for o in outcomes] == ["ok", "ok"]
    for trial in runs:
        vsweep_state.extract(tmp_path / "sweep" / "group", trial.workdir)
        alone = _config(*common, *trials[trial.name], "parallel.mode=sharded")
        trainer.train_and_evaluate(alone, tmp_path / "alone" / trial.name)
        vectorised = restoration.restore(trial.config, trial.workdir)[1].state.params
        reference = restoration.restore(alone, tmp_path / "alone" / trial.name)[1].state.params
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5),
            jax.device_get(vectorised),
            jax.device_get(reference),
        )


@pytest.mark.parametrize(
    "configs, message",
    [
        ([_lion(0.9, 0.01), optim.OptimConfig(optimizer="sgd")], "differs between trials"),
        ([_lion(0.9, 0.01), optim.OptimConfig()], "lion"),
        (
            [
                optim.OptimConfig(optimizer="sgd", kwargs={"nesterov": True}),
                optim.OptimConfig(optimizer="sgd", kwargs={"nesterov": False}),
            ],
            "only numbers",
        ),
        (
            [_lion(0.9, 0.01), optim.OptimConfig(optimizer="lion", kwargs={"b1": 0.5})],
            "same keys",
        ),
    ],
)
def test_trials_the_vectorised_optimizer_cannot_share_are_refused(configs, message):
    with pytest.raises(errors.ConfigError, match=message):
        optim.traced_structure(configs)


def test_a_trial_kwarg_shows_as_its_own_hparam(tmp_path, monkeypatch):
    seen = {}
    writer = logger.MetricWriter(tmp_path)
    tensorboard = writer._tensorboard_writer()
    monkeypatch.setattr(tensorboard, "add_hparams", lambda h, m, **_: seen.update(h))
    writer.write_hparams({"optim.kwargs": {"b1": 0.95}, "seed": 1}, {"loss": 1.0})
    assert seen == {"optim.kwargs.b1": 0.95, "seed": 1}


# -- the config: kwargs overrides, bad names and arguments in one line ----------------------


def test_kwargs_are_set_by_overrides_sweeps_and_presets_and_typos_stay_refused():
    config = config_utils.load_config(
        "configs/base.py:tiny",
        ["optim.optimizer=sgd", "optim.kwargs.momentum=0.9", "optim.kwargs.nesterov=true"],
    )
    assert config.optim.kwargs.to_dict() == {"momentum": 0.9, "nesterov": True}
    config_utils.apply_updates(config, {"optim.kwargs.accumulator_dtype": "bfloat16"})
    assert build.optim_config(config).kwargs["accumulator_dtype"] == "bfloat16"
    for typo in ("optim.kwarg.b1=0.9", "optim.kwargs=0.9", "optim.b3=0.9"):
        with pytest.raises(errors.ConfigError, match=r"unknown config key|is a group"):
            config_utils.apply_override(config, typo)
    from configs import common

    preset = common.apply_preset(
        common.base_config(model={}, data={}), {"p": {"optim.kwargs.b1": 0.5}}, "p"
    )
    assert preset.optim.kwargs.b1 == 0.5
    with pytest.raises(errors.ConfigError, match=r"unknown config key 'optim\.kwarg\.b1'"):
        common.apply_preset(
            common.base_config(model={}, data={}), {"p": {"optim.kwarg.b1": 1}}, "p"
        )


def test_a_config_json_from_before_optimizers_by_name_is_refused_in_one_line(tmp_path):
    tree = workdir_format.config_dict(_config())
    del tree["optim"]["kwargs"]
    test_workdir_format.write_older(tmp_path / "config.json", tree)
    test_workdir_format.assert_refused(tmp_path / "config.json")


@pytest.mark.parametrize(
    "overrides, mentions",
    [
        (["optim.optimizer=lino"], ["'lino'", "did you mean 'lion'", "adamw", "adafactor"]),
        (["optim.optimizer=lion", "optim.kwargs.b3=0.9"], ["optax.lion", "'b3'", "b2=0.99"]),
        (["optim.optimizer=lion", "optim.kwargs.b1=fast"], ["optax.lion", "'b1'", "a number"]),
        (["optim.optimizer=lion", "optim.kwargs.mask=1"], ["'mask'", "weight_decay_params"]),
        (["optim.optimizer=sgd", "optim.weight_decay=0.1"], ["optax.sgd", "momentum=None"]),
        (["optim.optimizer=contrib.dpsgd"], ["optax.contrib.dpsgd", "needs l2_norm_clip"]),
        (["optim.kwargs.b1=0.5"], ["recipe 'adam'", "optim.b1"]),
    ],
)
def test_a_bad_optimizer_or_argument_is_one_line_naming_what_is_accepted(overrides, mentions):
    with pytest.raises(errors.ConfigError) as info:
        _config(*overrides)
    message = str(info.value)
    assert "\n" not in message
    for text in mentions:
        assert text in message, (text, message)


def test_optax_refusing_a_value_is_a_config_error_naming_the_optimizer():
    config = optim.OptimConfig(optimizer="lion", kwargs={"mu_dtype": "float77"})
    with pytest.raises(errors.ConfigError, match=r"optax\.lion refused .*float77.*b1=0\.9"):
        optim.make_optimizer(config, d_model=8)
