"""Tensor parallelism on the (data, fsdp, tensor) mesh reaches one device's parameters.

Runs on the 8 simulated CPU devices of conftest.py. Each layout trains a tiny model (8 heads,
so that every layout up to tensor=8 divides them) for a few Adam steps from the same initial
state and batches as one device, and must end with the same parameters; the compiled step's
parameters and Adam moments must really be split over "tensor". Dropout and biases are off
for the reasons given in tests/test_parallel.py. The learning rate is small: float32 sums
are reduced in another order per layout, and Adam turns that rounding into update noise in
proportion to the step size (~1e-5 at learning_rate=1 even for pure data parallelism on
this model); at 0.2 the layouts agree to ~1e-6 while the parameters move by ~1e-2, and a
wrong gradient (a missing reduction over "tensor") shows up at ~1e-3.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tfjax import models
from tfjax.inference import beam_search, decoding
from tfjax.models import partitioning
from tfjax.parallel import strategies
from tfjax.training import optim, steps

STEPS = 3
GLOBAL_BATCH = 16
ATOL = 1e-5
LAYOUTS = [(8, 1, 1), (2, 2, 2), (1, 2, 4), (1, 1, 8)]  # (data, fsdp, tensor)
COMMON = dict(
    vocab_size=24, embed_dim=32, num_heads=8, mlp_dim=64, dropout_rate=0.0, use_bias=False
)
MODELS = {
    # Unfused q, k, v: the Megatron layout; shared, tied embeddings.
    "encoder_decoder": models.ModelConfig(
        num_layers=1, num_decoder_layers=1, fused_qkv=False, **COMMON
    ),
    # Grouped-query (K = 4) through the fused [D, N + 2K, H] projection; tied output.
    "decoder_only": models.ModelConfig(kind="decoder_only", num_layers=1, num_kv_heads=4, **COMMON),
    # Two layers as one nn.scan: parameters stacked on a leading "layers" axis.
    "decoder_only_scanned": models.ModelConfig(
        kind="decoder_only", num_layers=2, num_kv_heads=4, scan_layers=True, **COMMON
    ),
}


def _batches(kind: str) -> list[dict[str, np.ndarray]]:
    kind = MODELS[kind].kind if kind in MODELS else kind
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        seg = (np.arange(8)[None] < rng.integers(2, 8, size=(GLOBAL_BATCH, 1))).astype(np.int32)
        batch = {"targets": _tokens(rng, seg), "targets_segment_ids": seg}
        if kind == "encoder_decoder":
            batch.update(inputs=_tokens(rng, seg), inputs_segment_ids=seg)
        batches.append(batch)
    return batches


def _tokens(rng, segment_ids):
    return rng.integers(3, 24, segment_ids.shape).astype(np.int32) * segment_ids


@functools.cache
def _setup(kind: str):
    """(model, initial state on the host, pure step, batches, one device's final params)."""
    model = models.create_model(MODELS[kind])
    kind = MODELS[kind].kind
    optimizer, schedule = optim.make_optimizer(
        optim.OptimConfig(learning_rate=0.2, warmup_steps=4, grad_clip_norm=1.0), 32
    )
    batches = _batches(kind)
    state = steps.create_train_state(model, optimizer, jax.random.key(0), batches[0], kind)
    state = jax.device_get(state)  # donation must not consume the shared initial state
    step = steps.make_train_step(model, optimizer, schedule, kind=kind, label_smoothing=0.1)
    single, compiled = state, jax.jit(step)
    for batch in batches:
        single, _ = compiled(single, batch, jax.random.key(1))
    return model, state, step, batches, jax.device_get(single.params)


def _strategy(data: int, fsdp: int, tensor: int) -> strategies.Sharded:
    strategy = strategies.create(
        "sharded",
        fsdp=fsdp,
        tensor=tensor,
        fsdp_min_size=64,  # the tiny model's matrices are FSDP-sharded too
        logical_axes=partitioning.state_axes,
    )
    assert dict(strategy.mesh.shape) == {"data": data, "fsdp": fsdp, "tensor": tensor}
    return strategy


def _train(kind: str, layout: tuple[int, int, int]):
    """(final params on the host, the sharded final state) of `layout`."""
    _, state, step, batches, _ = _setup(kind)
    strategy = _strategy(*layout)
    compiled = strategy.compile_train_step(step, jax.eval_shape(lambda: state))
    placed = strategy.put_state(state)
    for batch in batches:
        placed, _ = compiled(placed, strategy.put_batch(batch), jax.random.key(1))
    return jax.device_get(placed.params), placed


def _specs(tree) -> list[tuple]:
    return [tuple(x.sharding.spec) for x in jax.tree.leaves(tree)]


def _check_matches_one_device(kind, layout):
    _, initial, _, _, expected = _setup(kind)
    params, placed = _train(kind, layout)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=ATOL), params, expected)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), expected, initial.params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the parameters really trained
    return placed


def test_tensor_and_fsdp_step_really_splits_heads_mlp_and_adam_moments():
    placed = _check_matches_one_device("decoder_only", (2, 2, 2))
    layer = placed.params["decoder"]["layer_0"]
    # [D, N + 2K, H]: fused heads over tensor; D (the largest whole dimension) over fsdp.
    assert layer["self_attention"]["qkv"]["kernel"].sharding.spec == P("fsdp", "tensor", None)
    assert layer["self_attention"]["out"]["kernel"].sharding.spec == P("tensor", None, "fsdp")
    assert layer["mlp"]["wi"]["kernel"].sharding.spec == P("fsdp", "tensor")
    assert layer["mlp"]["wo"]["kernel"].sharding.spec == P("tensor", "fsdp")
    # [D, F] = [32, 64]: a device holds half of D (fsdp) and half of F (tensor).
    assert layer["mlp"]["wi"]["kernel"].addressable_shards[0].data.shape == (16, 32)
    moments = [x for x in jax.tree.leaves(placed.opt_state) if x.ndim]  # Adam's mu, then nu
    assert _specs(moments) == 2 * _specs(placed.params)
    assert sum("tensor" in spec for spec in _specs(placed.params)) == 4  # qkv, out, wi, wo


@pytest.mark.slow
def test_a_scanned_stack_splits_over_tensor_and_matches_one_device():
    placed = _check_matches_one_device("decoder_only_scanned", (2, 2, 2))
    stack = placed.params["decoder"]["layers"]  # [layers, ...]: the layer axis stays whole
    assert stack["self_attention"]["qkv"]["kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert stack["mlp"]["wo"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")


def test_the_step_pins_activations_by_the_rules():
    """Lowered (not compiled) on (2, 2, 2): the model's logical constraints reach the program
    as sharding constraints, the heads [B, L, N, H] and the MLP hidden [B, L, F] over
    "tensor", the residual stream [B, L, D] over ("data", "fsdp")."""
    model = models.create_model(MODELS["decoder_only"])
    optimizer, schedule = optim.make_optimizer(optim.OptimConfig(), 32)
    batch = _batches("decoder_only")[0]
    state = jax.eval_shape(
        lambda: steps.create_train_state(model, optimizer, jax.random.key(0), batch, "decoder_only")
    )
    step = steps.make_train_step(
        model, optimizer, schedule, kind="decoder_only", label_smoothing=0.1
    )
    strategy = _strategy(2, 2, 2)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    lowered = strategy.compile_train_step(step, state).lower(
        *strategy.abstract_inputs(state, shapes)
    )
    constraints = [line for line in lowered.as_text().splitlines() if "sharding_constraint" in line]
    heads = '[{"data", "fsdp"}, {}, {"tensor"}, {}]> : tensor<16x8x8x4xf32>'
    mlp = '[{"data", "fsdp"}, {}, {"tensor"}]> : tensor<16x8x64xf32>'
    stream = '[{"data", "fsdp"}, {}, {}]> : tensor<16x8x32xf32>'
    for layout in (heads, mlp, stream):
        assert any(layout in line for line in constraints), (layout, constraints)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "x".join(map(str, x)))
@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder"])
def test_every_layout_matches_one_device(kind, layout):
    placed = _check_matches_one_device(kind, layout)
    tensor_split = sum("tensor" in spec for spec in _specs(placed.params))
    assert tensor_split > 0 if layout[2] > 1 else tensor_split == 0


def _tp_params(kind: str, tensor: int = 8):
    """The initial parameters placed with heads and the MLP split over `tensor` devices."""
    model, state, *_ = _setup(kind)
    placed = _strategy(8 // tensor, 1, tensor).put_state(state.params)
    assert any("tensor" in spec for spec in _specs(placed))
    return model, state.params, placed


@pytest.mark.slow
def test_greedy_and_beam_search_decode_a_tensor_parallel_encoder_decoder():
    model, params, placed = _tp_params("encoder_decoder")
    batch = _batches("encoder_decoder")[0]
    inputs, segments = (
        jnp.asarray(batch["inputs"][:4]),
        jnp.asarray(batch["inputs_segment_ids"][:4]),
    )

    def greedy(p):
        return decoding.generate(
            model, p, inputs=inputs, inputs_segment_ids=segments, max_length=6, eos_id=2
        )

    def beam(p):
        return beam_search.beam_search(
            model, p, inputs, inputs_segment_ids=segments, beam_size=3, max_length=6, eos_id=2
        )[0]

    for decode in (greedy, beam):
        expected = jax.jit(decode)(params)
        np.testing.assert_array_equal(jax.jit(decode)(placed), expected)
        assert np.asarray(expected).any()


def test_greedy_generation_of_a_tensor_parallel_decoder():
    model, params, placed = _tp_params("decoder_only", tensor=4)
    prompts = jnp.asarray(_batches("decoder_only")[0]["targets"][:4, :3])

    def greedy(p):
        return decoding.generate(
            model, p, prompts=prompts, prompt_lengths=jnp.full(4, 3, jnp.int32), max_length=8,
            eos_id=2,
        )  # fmt: skip

    np.testing.assert_array_equal(jax.jit(greedy)(placed), jax.jit(greedy)(params))
