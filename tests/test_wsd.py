"""The warmup-stable-decay schedule (tfjax/training/schedules.py `wsd_schedule`): against its
formula written out, in `make_optimizer` and in a vectorised sweep's traced optimizer (trials
differing in the decay), and its config checks."""

import math

import jax
import jax.numpy as jnp
import pytest

from tfjax import errors
from tfjax.training import optim, schedules

PEAK, WARMUP, TOTAL, END = 1e-3, 10, 100, 0.1


def _formula(s, fraction, shape):
    """WSD written out: linear warmup, constant, then the decay over the last `fraction`."""
    start = TOTAL * (1 - fraction)
    if s <= start:
        return PEAK * min(1.0, s / WARMUP)
    p = min(1.0, (s - start) / (TOTAL - start))
    factor = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "sqrt": 1 - p**0.5}
    return PEAK * END + PEAK * (1 - END) * factor[shape]


STEPS = (1, 5, 10, 11, 50, 79, 80, 81, 85, 90, 99, 100, 101, 400)


@pytest.mark.parametrize("shape", schedules.DECAY_SHAPES)
def test_wsd_schedule_follows_its_formula(shape):
    schedule = schedules.wsd_schedule(PEAK, WARMUP, TOTAL, 0.2, END, shape)
    for s in STEPS:  # optax's count is s - 1
        assert float(schedule(jnp.int32(s - 1))) == pytest.approx(_formula(s, 0.2, shape)), s
    # The literal points: the stable phase, the decay's middle, the floor.
    assert float(schedule(jnp.int32(49))) == pytest.approx(PEAK)
    middle = {"linear": 0.5, "cosine": 0.5, "sqrt": 1 - 0.5**0.5}[shape]
    assert float(schedule(jnp.int32(89))) == pytest.approx(PEAK * (END + (1 - END) * middle))
    assert float(schedule(jnp.int32(99))) == pytest.approx(PEAK * END)


def test_vectorised_trials_differ_in_the_decay():
    """Three trials (two shapes, two fractions, a cosine) in one traced optimizer: each trial's
    LR is its own `make_optimizer` schedule's."""
    configs = [
        optim.OptimConfig(
            schedule="wsd",
            learning_rate=PEAK,
            warmup_steps=WARMUP,
            decay_steps=TOTAL,
            end_lr_fraction=END,
            decay_fraction=fraction,
            decay_shape=shape,
        )
        for fraction, shape in ((0.2, "linear"), (0.5, "sqrt"), (1 - WARMUP / TOTAL, "cosine"))
    ]
    configs.append(optim.OptimConfig(schedule="cosine", warmup_steps=WARMUP, decay_steps=TOTAL))
    structure = optim.traced_structure(configs)
    hyper = [optim.traced_hyper(c, structure) for c in configs]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *hyper)
    counts = jnp.asarray([s - 1 for s in STEPS], jnp.int32)

    def lrs(h):
        _, schedule = optim.traced_optimizer(h, structure, d_model=8)
        return jax.vmap(schedule)(counts)

    traced = jax.jit(jax.vmap(lrs))(stacked)  # [trials, steps]
    for row, config in zip(traced, configs, strict=True):
        alone = optim.make_schedule(config, d_model=8)
        assert [float(x) for x in row] == pytest.approx([float(alone(c)) for c in counts])
    # the sqrt trial's LR at s = 85 (0.7 into its decay) is its formula's
    sqrt_row = dict(zip(STEPS, traced[1].tolist(), strict=True))
    assert sqrt_row[85] == pytest.approx(_formula(85, 0.5, "sqrt"))


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"decay_fraction": 0.0}, "decay_fraction"),
        ({"decay_fraction": 0.95}, "decay_fraction"),  # the decay would start inside warmup
        ({"decay_shape": "step"}, "decay_shape"),
        ({"decay_steps": 5}, "decay_steps"),
    ],
)
def test_wsd_config_checks_name_the_field(overrides, field):
    fields = dict(schedule="wsd", warmup_steps=WARMUP, decay_steps=TOTAL) | overrides
    with pytest.raises(errors.ConfigError, match=f"OptimConfig.{field}"):
        optim.OptimConfig(**fields)


@pytest.mark.slow
def test_a_decay_branches_off_a_stable_phase_checkpoint(tmp_path):
    """docs/training.md's branch: a WSD run planned for 8 steps is copied at its stable-phase
    checkpoint (step 4) into a new workdir, which resumes there with a decay ending at step 6;
    the trunk and the branch log the formula's LR at every step."""
    import shutil

    from experiments import config_utils
    from tfjax.runs import trainer, workdir_format
    from tfjax.training import logger

    trunk, branch = tmp_path / "wsd", tmp_path / "wsd_6"
    flags = ["optim.schedule=wsd", "optim.learning_rate=0.01", "optim.warmup_steps=2"]
    flags += ["optim.decay_steps=8", "optim.decay_fraction=0.25", "train.num_train_steps=4"]
    flags += ["train.checkpoint_every_steps=2", "train.log_every_steps=1"]
    trainer.train_and_evaluate(config_utils.load_config("configs/lm.py:tiny", flags), trunk)
    # The documented commands: config, tokenizer and the one checkpoint into a new workdir.
    (branch / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(trunk / name, branch / name)
    shutil.copytree(trunk / "checkpoints" / "4", branch / "checkpoints" / "4")
    config = workdir_format.load_config_json(branch / "config.json").unlock()
    config.train.num_train_steps, config.optim.decay_steps = 6, 6
    config.optim.decay_fraction = 1 / 3
    trainer.train_and_evaluate(config, branch)

    assert [r["step"] for r in logger.read_metrics(branch, "startup")] == [5]  # resumed at 4
    lrs = {r["step"]: r["learning_rate"] for r in logger.read_metrics(trunk, "train")}
    assert [lrs[s] for s in (1, 2, 3, 4)] == pytest.approx([0.005, 0.01, 0.01, 0.01])
    lrs = {r["step"]: r["learning_rate"] for r in logger.read_metrics(branch, "train")}
    # s0 = 6 · (1 - 1/3) = 4: linear to 0 at s = 6.
    assert [lrs[s] for s in (5, 6)] == pytest.approx([0.005, 0.0], abs=1e-9)
