"""pmap, jit+mesh (with and without FSDP) and one device reach the same parameters.

Runs on the 8 simulated CPU devices of conftest.py. Dropout is off: with dropout each mode draws
its masks differently by design (pmap folds the device index into the key). Biases are off: the
key bias of attention has an exactly-zero gradient in exact arithmetic (softmax ignores a shift
shared by a whole row), so its float32 gradient is rounding noise that Adam (eps 1e-9) turns into
full-size steps whose sign depends on the reduction order of each mode.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfjax import models
from tfjax.parallel import strategies
from tfjax.training import optim, steps

STEPS = 10
GLOBAL_BATCH = 16
# float32 sums are reduced in a different order per mode; after 10 Adam steps the parameters
# agree to ~1e-6; 1e-5 leaves margin without hiding a real difference (a wrong gradient scale
# shows up at ~1e-3).
ATOL = 1e-5


def _setup():
    cfg = models.ModelConfig(
        vocab_size=20,
        embed_dim=16,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        mlp_dim=32,
        dropout_rate=0.0,
        use_bias=False,
    )
    model = models.create_model(cfg)
    optimizer, schedule = optim.make_optimizer(
        optim.OptimConfig(learning_rate=1.0, warmup_steps=4, grad_clip_norm=1.0), 16
    )
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        lengths = rng.integers(2, 8, size=(GLOBAL_BATCH, 1))
        positions = np.arange(8)[None]
        seg = (positions < lengths).astype(np.int32)
        batches.append(
            {
                "inputs": rng.integers(3, 20, (GLOBAL_BATCH, 8)).astype(np.int32) * seg,
                "inputs_segment_ids": seg,
                "targets": rng.integers(3, 20, (GLOBAL_BATCH, 8)).astype(np.int32) * seg,
                "targets_segment_ids": seg,
            }
        )
    state = steps.create_train_state(
        model, optimizer, jax.random.key(0), batches[0], "encoder_decoder"
    )
    step = steps.make_train_step(
        model, optimizer, schedule, kind="encoder_decoder", label_smoothing=0.1
    )
    return state, step, batches


def _run(strategy, state, step, batches, *, inspect=None):
    abstract = jax.eval_shape(lambda: state)
    compiled = strategy.compile_train_step(step, abstract)
    state = strategy.put_state(state)
    losses = []
    for batch in batches:
        state, metrics = compiled(state, strategy.put_batch(batch), jax.random.key(1))
        losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
    if inspect is not None:
        inspect(state)
    return jax.device_get(strategy.host_state(state).params), losses


def _single_device(state, step, batches):
    compiled = jax.jit(step)
    losses = []
    for batch in batches:
        state, metrics = compiled(state, batch, jax.random.key(1))
        losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
    return jax.device_get(state.params), losses


@pytest.mark.parametrize(
    "mode, fsdp", [pytest.param("pmap", 1, marks=pytest.mark.slow), ("sharded", 1), ("sharded", 2)]
)
def test_parallel_modes_match_one_device(mode, fsdp):
    assert jax.device_count() == 8
    state, step, batches = _setup()
    initial = jax.device_get(state.params)  # donation may consume the buffers of `state`
    expected, expected_losses = _single_device(state, step, batches)
    params, losses = _run(strategies.create(mode, fsdp=fsdp), state, step, batches)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), params, expected)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), expected, initial)
    assert max(jax.tree.leaves(moved)) > 1e-2  # the parameters really trained


def _fsdp_sharded(tree) -> list[bool]:
    """Per array leaf: is it partitioned over the "fsdp" mesh axis?"""
    leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) and x.ndim]
    return ["fsdp" in tuple(x.sharding.spec) for x in leaves]


def test_fsdp_step_really_shards_parameters_and_adam_moments():
    # The test model's 22 arrays are all under FSDP_MIN_SIZE, so with the default nothing is
    # sharded and a bug in the sharded path would pass. With the threshold at 64 elements every
    # matrix is split over the fsdp axis; the step must still match one device.
    state, step, batches = _setup()
    default = strategies.create("sharded", fsdp=2).shardings(jax.eval_shape(lambda: state))
    assert all(x.spec == jax.sharding.PartitionSpec() for x in jax.tree.leaves(default))
    expected, expected_losses = _single_device(state, step, batches)
    seen = {}

    def inspect(state):
        seen["params"] = _fsdp_sharded(state.params)
        seen["moments"] = _fsdp_sharded(state.opt_state)

    strategy = strategies.create("sharded", fsdp=2, fsdp_min_size=64)
    params, losses = _run(strategy, state, step, batches, inspect=inspect)
    assert sum(seen["params"]) >= 10, seen["params"]  # the [D, ...] and [V, D] matrices
    assert sum(seen["moments"]) == 2 * sum(seen["params"])  # Adam's mu and nu follow them
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), params, expected)


def test_fsdp_shards_large_parameters_and_rejects_bad_sizes():
    strategy = strategies.create("sharded", fsdp=4)
    spec = strategies._fsdp_spec((256, 64), 4)
    assert spec == jax.sharding.PartitionSpec("fsdp", None)
    assert strategies._fsdp_spec((8,), 4) == jax.sharding.PartitionSpec()
    x = strategy.put_state({"w": jnp.ones((256, 64))})["w"]
    assert len({str(s.index) for s in x.addressable_shards}) == 4
    with pytest.raises(ValueError, match="fsdp"):
        strategies.create("sharded", fsdp=3)
    with pytest.raises(ValueError, match=r"parallel\.mode"):
        strategies.create("tpu-magic")
    with pytest.raises(ValueError, match="global_batch_size"):
        strategies.host_batch_size(12)
