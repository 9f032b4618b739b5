"""tfjax/training/optim.py and schedules.py: schedules against their formulas, config checks,
hand-written Adam."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfjax.training import optim, schedules


def _lr(schedule, count):
    return float(schedule(jnp.asarray(count, jnp.int32)))


def test_paper_schedule_matches_formula():
    d_model, warmup, scale = 512, 4000, 2.0
    schedule = schedules.paper_schedule(d_model, warmup, scale=scale)

    def formula(s):  # Vaswani et al. 2017 eq. (3), s counted from 1
        return scale * d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)

    for s in (1, 2, warmup // 2, warmup, warmup + 1, 2 * warmup, 10 * warmup):
        assert _lr(schedule, s - 1) == pytest.approx(formula(s), rel=1e-6), s
    # optax's count 0 is the paper's step 1: nonzero, not formula(0) = 0.
    assert _lr(schedule, 0) == pytest.approx(scale * d_model**-0.5 * warmup**-1.5, rel=1e-6)
    peak = scale * (d_model * warmup) ** -0.5
    assert _lr(schedule, warmup - 1) == pytest.approx(peak, rel=1e-6)
    assert _lr(schedule, 2 * warmup - 1) == pytest.approx(peak / math.sqrt(2), rel=1e-6)
    assert _lr(schedule, warmup - 2) < _lr(schedule, warmup - 1) > _lr(schedule, warmup)


def test_rsqrt_schedule_key_points():
    schedule = schedules.rsqrt_schedule(0.5, 100)
    assert _lr(schedule, 0) == pytest.approx(0.5 / 100, rel=1e-6)
    assert _lr(schedule, 49) == pytest.approx(0.25, rel=1e-6)
    assert _lr(schedule, 99) == pytest.approx(0.5, rel=1e-6)  # peak at s = warmup
    assert _lr(schedule, 399) == pytest.approx(0.5 * math.sqrt(100 / 400), rel=1e-6)
    assert _lr(schedule, 899) == pytest.approx(0.5 / 3, rel=1e-6)


def test_cosine_schedule_key_points():
    peak, warmup, decay, end = 1e-3, 10, 110, 0.1
    schedule = schedules.cosine_schedule(peak, warmup, decay, end)

    def formula(s):
        if s < warmup:
            return peak * s / warmup
        progress = min((s - warmup) / (decay - warmup), 1.0)
        return peak * end + peak * (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))

    assert _lr(schedule, 4) == pytest.approx(peak / 2, rel=1e-6)
    assert _lr(schedule, warmup - 1) == pytest.approx(peak, rel=1e-6)
    assert _lr(schedule, 59) == pytest.approx(peak * (end + (1 - end) / 2), rel=1e-6)  # midpoint
    assert _lr(schedule, decay - 1) == pytest.approx(peak * end, rel=1e-5)
    assert _lr(schedule, 10 * decay) == pytest.approx(peak * end, rel=1e-5)
    for s in (1, 3, 10, 11, 30, 77, 109, 110, 500):
        assert _lr(schedule, s - 1) == pytest.approx(formula(s), rel=1e-5), s


def test_make_schedule_dispatch():
    config = optim.OptimConfig(schedule="constant", learning_rate=0.3, warmup_steps=3)
    schedule = optim.make_schedule(config, d_model=8)
    assert [_lr(schedule, c) for c in (0, 2, 50)] == pytest.approx([0.1, 0.3, 0.3])
    config = optim.OptimConfig(schedule="constant", learning_rate=0.3, warmup_steps=0)
    assert _lr(optim.make_schedule(config, d_model=8), 0) == pytest.approx(0.3)
    config = optim.OptimConfig(learning_rate=2.0, warmup_steps=10)  # paper: learning_rate = scale
    assert _lr(optim.make_schedule(config, d_model=64), 9) == pytest.approx(2.0 / math.sqrt(640))
    config = optim.OptimConfig(schedule="rsqrt", learning_rate=0.1, warmup_steps=10)
    assert _lr(optim.make_schedule(config, d_model=64), 9) == pytest.approx(0.1)


def test_config_defaults_follow_the_paper():
    config = optim.OptimConfig()
    assert (config.optimizer, config.schedule, config.warmup_steps) == ("adam", "paper", 4000)
    assert (config.b1, config.b2, config.eps) == (0.9, 0.98, 1e-9)


def test_config_from_config_dict():
    ml_collections = pytest.importorskip("ml_collections")
    cfg = ml_collections.ConfigDict({"optim": {"optimizer": "adamw", "weight_decay": 0.01}})
    assert optim.OptimConfig(**cfg.optim).weight_decay == 0.01


@pytest.mark.parametrize(
    "overrides, field, mentions",
    [
        ({"optimizer": "sgdd"}, "optimizer", "adamw"),
        ({"schedule": "linear"}, "schedule", "cosine"),
        ({"learning_rate": 0.0}, "learning_rate", "> 0"),
        ({"warmup_steps": -1}, "warmup_steps", ">= 0"),
        ({"warmup_steps": True}, "warmup_steps", "integer"),
        ({"warmup_steps": 0}, "warmup_steps", "paper"),
        ({"b1": 1.0}, "b1", "[0, 1)"),
        ({"b2": -0.1}, "b2", "[0, 1)"),
        ({"eps": 0.0}, "eps", "> 0"),
        ({"optimizer": "adamw", "weight_decay": -0.1}, "weight_decay", ">= 0"),
        ({"weight_decay_params": "biases"}, "weight_decay_params", "matrices"),
        ({"weight_decay": 0.1}, "weight_decay", "adamw"),
        ({"grad_clip_norm": -1.0}, "grad_clip_norm", ">= 0"),
        ({"grad_accum_steps": 0}, "grad_accum_steps", ">= 1"),
        ({"decay_steps": -5}, "decay_steps", ">= 0"),
        ({"schedule": "cosine", "warmup_steps": 10}, "decay_steps", "cosine"),
        ({"end_lr_fraction": 1.5}, "end_lr_fraction", "[0, 1]"),
    ],
)
def test_config_validation_names_the_field(overrides, field, mentions):
    with pytest.raises(ValueError) as info:
        optim.OptimConfig(**overrides)
    message = str(info.value)
    assert f"OptimConfig.{field}" in message and mentions in message
    assert repr(overrides.get(field, "")) in message or field == "decay_steps"


def _adam_reference(grads, lrs, b1=0.9, b2=0.98, eps=1e-9):
    """Kingma & Ba 2015, Algorithm 1, in float64: the list of updates."""
    m = np.zeros_like(grads[0], np.float64)
    v = np.zeros_like(grads[0], np.float64)
    updates = []
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        updates.append(-lr * m_hat / (np.sqrt(v_hat) + eps))
    return updates


def _run(optimizer, grads, params):
    state = optimizer.init(params)
    updates = []
    for g in grads:
        update, state = optimizer.update(jnp.asarray(g, jnp.float32), state, params)
        params = optax.apply_updates(params, update)
        updates.append(np.asarray(update))
    return updates


# Gradients of 0.5 · Σ a x² at changing points; the tiny entry makes eps = 1e-9 visible.
_GRADS = [np.array([1.0, -2.0, 1e-9]), np.array([-3.0, 0.5, 1e-9]), np.array([0.2, 4.0, 0.0])]


def test_adam_uses_paper_hyperparameters_and_schedule():
    d_model, warmup = 16, 2
    config = optim.OptimConfig(warmup_steps=warmup)
    optimizer, _ = optim.make_optimizer(config, d_model)
    lrs = [d_model**-0.5 * min(s**-0.5, s * warmup**-1.5) for s in (1, 2, 3)]
    expected = _adam_reference(_GRADS, lrs)
    actual = _run(optimizer, _GRADS, jnp.zeros(3))
    for got, want in zip(actual, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Sanity: the first update of the tiny entry is lr · g / (g + eps) = lr / 2 only for eps 1e-9.
    np.testing.assert_allclose(actual[0][2], -lrs[0] / 2, rtol=1e-3)


def test_adamw_applies_decoupled_weight_decay():
    config = optim.OptimConfig(
        optimizer="adamw", weight_decay=0.1, schedule="constant", learning_rate=0.01, warmup_steps=0
    )
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    params = jnp.array([1.0, -2.0, 3.0])
    update, _ = optimizer.update(jnp.array([0.5, 0.5, -0.5]), optimizer.init(params), params)
    expected = -0.01 * (np.sign([0.5, 0.5, -0.5]) + 0.1 * np.asarray(params))
    np.testing.assert_allclose(update, expected, rtol=1e-5)


def _decay_only_update(config, params):
    """The update of zero gradients: only the decay term, -lr · wd · param, where decayed."""
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    zeros = jax.tree.map(jnp.zeros_like, params)
    update, _ = optimizer.update(zeros, optimizer.init(params), params)
    return update


_LAYER = {
    "dense": {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)},
    "norm": {"scale": jnp.full((3,), 2.0), "bias": jnp.full((3,), 2.0)},
    "embed": {"embedding": jnp.full((4, 3), 2.0)},
    "logits_bias": jnp.full((4,), 2.0),
    # A scanned stack: layer axis first, so its bias and scale are 2-D and stay undecayed.
    "scan": {
        "kernel": jnp.full((2, 3, 3), 2.0),
        "bias": jnp.full((2, 3), 2.0),
        "scale": jnp.full((2, 3), 2.0),
    },
}


def _adamw_config(params_rule: str) -> optim.OptimConfig:
    """AdamW, decay 0.1 at a constant learning rate of 0.01."""
    constant = dict(schedule="constant", learning_rate=0.01, warmup_steps=0)
    return optim.OptimConfig(
        optimizer="adamw", weight_decay=0.1, weight_decay_params=params_rule, **constant
    )


@pytest.mark.parametrize("params_rule", ["all", "matrices"])
def test_adamw_decays_the_parameters_weight_decay_params_names(params_rule):
    config = _adamw_config(params_rule)
    update = _decay_only_update(config, _LAYER)
    decayed = {"['dense']['kernel']", "['embed']['embedding']", "['scan']['kernel']"}
    for path, leaf in jax.tree_util.tree_leaves_with_path(update):
        name = jax.tree_util.keystr(path)
        want = -0.01 * 0.1 * 2.0 if params_rule == "all" or name in decayed else 0.0
        np.testing.assert_allclose(leaf, np.full(leaf.shape, want), atol=1e-9, err_msg=name)


def test_traced_optimizer_takes_the_decay_mask():
    config = _adamw_config("matrices")
    structure = optim.traced_structure([config])
    optimizer, _ = optim.traced_optimizer(optim.traced_hyper(config, structure), structure, 8)
    zeros = jax.tree.map(jnp.zeros_like, _LAYER)
    traced, _ = optimizer.update(zeros, optimizer.init(_LAYER), _LAYER)
    eager = _decay_only_update(config, _LAYER)
    for got, want in zip(jax.tree.leaves(traced), jax.tree.leaves(eager), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)
    assert float(traced["norm"]["scale"][0]) == 0.0 and float(traced["dense"]["kernel"][0, 0]) < 0


def test_clipping_is_applied_before_adam():
    # Adam is scale-invariant per step, so compare with Adam on the clipped gradients: the
    # first (large) gradient is rescaled to norm 1, the second (small) one is untouched.
    grads = [np.array([30.0, 40.0]), np.array([0.3, -0.1])]
    config = optim.OptimConfig(
        schedule="constant", learning_rate=0.1, warmup_steps=0, grad_clip_norm=1.0
    )
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    actual = _run(optimizer, grads, jnp.zeros(2))
    clipped = [grads[0] / 50.0, grads[1]]
    for got, want in zip(actual, _adam_reference(clipped, [0.1, 0.1]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    unclipped = _adam_reference(grads, [0.1, 0.1])[1]
    assert not np.allclose(actual[1], unclipped, rtol=1e-2)


def test_clipping_bounds_gradient_norm_seen_by_optimizer():
    config = optim.OptimConfig(
        schedule="constant", learning_rate=1.0, warmup_steps=0, grad_clip_norm=0.5
    )
    optimizer, _ = optim.make_optimizer(config, d_model=8)
    grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([12.0])}  # global norm 13
    state = optimizer.init(grads)
    # The first adam moment after one step is (1 - b1) · clipped gradient.
    _, state = optimizer.update(grads, state, grads)
    norm = optax.tree.norm(optax.tree_utils.tree_get(state, "mu")) / (1 - config.b1)
    assert float(norm) == pytest.approx(0.5, rel=1e-5)


def test_multisteps_accumulates_every_k_updates():
    k = 2
    base = dict(schedule="constant", learning_rate=0.1, warmup_steps=0)
    accumulated, _ = optim.make_optimizer(optim.OptimConfig(**base, grad_accum_steps=k), d_model=8)
    single, _ = optim.make_optimizer(optim.OptimConfig(**base), d_model=8)
    micro = [
        np.array([1.0, -2.0]),
        np.array([3.0, 0.0]),
        np.array([-1.0, 1.0]),
        np.array([0.5, 2.0]),
    ]
    actual = _run(accumulated, micro, jnp.zeros(2))
    np.testing.assert_array_equal(actual[0], 0.0)
    np.testing.assert_array_equal(actual[2], 0.0)
    averaged = [(micro[0] + micro[1]) / 2, (micro[2] + micro[3]) / 2]
    expected = _run(single, averaged, jnp.zeros(2))
    np.testing.assert_allclose(actual[1], expected[0], rtol=1e-6)
    np.testing.assert_allclose(actual[3], expected[1], rtol=1e-6)
    assert not np.allclose(actual[1], 0.0)


def test_multisteps_advances_schedule_once_per_applied_update():
    base = dict(learning_rate=1.0, warmup_steps=4)  # paper schedule, d_model 16
    accumulated, _ = optim.make_optimizer(optim.OptimConfig(**base, grad_accum_steps=2), 16)
    grad = [np.array([1.0])] * 4
    actual = _run(accumulated, grad, jnp.zeros(1))
    lrs = [16**-0.5 * min(s**-0.5, s * 4**-1.5) for s in (1, 2)]
    np.testing.assert_allclose([actual[1][0], actual[3][0]], [-lrs[0], -lrs[1]], rtol=1e-5)


def test_make_optimizer_jits():
    config = optim.OptimConfig(grad_clip_norm=1.0, grad_accum_steps=2, warmup_steps=10)
    optimizer, schedule = optim.make_optimizer(config, d_model=8)
    params = {"w": jnp.ones((2, 3))}
    state = optimizer.init(params)
    update, state = jax.jit(optimizer.update)(params, state, params)
    assert jax.tree.structure(update) == jax.tree.structure(params)
    assert callable(schedule)


def test_global_norm_is_the_norm_of_all_elements_on_every_platform():
    from tfjax.training import steps

    tree = {
        "a": jnp.arange(6.0).reshape(2, 3),  # 0+1+4+9+16+25 = 55
        "b": [jnp.full((4,), 2.0, jnp.bfloat16), jnp.array(3.0)],  # 16 + 9
    }
    want = np.sqrt(80.0)
    np.testing.assert_allclose(steps.global_norm(tree), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(steps.global_norm)(tree), want, rtol=1e-6)
    leaves = jax.tree.leaves(tree)
    np.testing.assert_allclose(steps._norm_per_array(leaves), want, rtol=1e-6)
    np.testing.assert_allclose(steps._norm_raveled(leaves), want, rtol=1e-6)
    assert steps.global_norm({}) == 0.0
    # The CPU program reduces one raveled vector; a GPU/TPU program one sum per array (a
    # concatenation of FSDP-sharded leaves would gather them).
    cpu = jax.jit(steps.global_norm).lower(tree).as_text()
    assert cpu.count("concatenate") == 1
    gpu = jax.export.export(jax.jit(steps.global_norm), platforms=["cuda"])(tree)
    assert "concatenate" not in gpu.mlir_module()
    # fast_path=False is the per-array reduction everywhere, the CPU included, same value.
    stock = jax.jit(lambda t: steps.global_norm(t, fast_path=False))
    assert "concatenate" not in stock.lower(tree).as_text()
    np.testing.assert_allclose(stock(tree), want, rtol=1e-6)
