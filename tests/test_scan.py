"""Scanned layer stacks and rematerialisation: `tfjax.nn.stacking`, ModelConfig.scan_layers/remat.

The scanned model must compute the unscanned model's numbers from the same (stacked) weights:
logits, gradients and cached decoding. Remat must change memory only, never the numbers.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfjax import errors, models
from tfjax.inference import beam_search, decoding
from tfjax.nn import layers, stacking
from tfjax.runs import workdir_format
from tfjax.training import checkpointing, steps

TINY = dict(
    vocab_size=31,
    embed_dim=16,
    num_layers=3,
    num_decoder_layers=2,
    num_heads=4,
    mlp_dim=32,
    max_len=32,
    dropout_rate=0.0,
)
# Two packed rows: segments 1 and 2 with their own positions, then padding (segment 0).
SRC = jnp.array([[5, 6, 7, 8, 9, 2], [10, 11, 2, 12, 2, 0]], jnp.int32)
SRC_SEG = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 2, 2, 0]], jnp.int32)
SRC_POS = jnp.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]], jnp.int32)
TGT = jnp.array([[13, 14, 15, 2, 0], [16, 2, 17, 18, 2]], jnp.int32)
TGT_SEG = jnp.array([[1, 1, 1, 1, 0], [1, 1, 2, 2, 2]], jnp.int32)
TGT_POS = jnp.array([[0, 1, 2, 3, 0], [0, 1, 0, 1, 2]], jnp.int32)
KINDS = ("encoder_decoder", "decoder_only", "encoder_only")
# Compiling dominates on CPU; XLA's backend optimisation level 0 halves it.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _config(**overrides) -> models.ModelConfig:
    return models.ModelConfig(**{**TINY, **overrides})


def _inputs(kind: str) -> tuple[tuple, dict]:
    """(args, kwargs) of the model call for `kind`: packed rows with segment ids and positions."""
    src = dict(inputs_segment_ids=SRC_SEG, inputs_positions=SRC_POS)
    tgt = dict(targets_segment_ids=TGT_SEG, targets_positions=TGT_POS)
    if kind == "encoder_decoder":
        return (SRC, TGT), {**src, **tgt}
    if kind == "decoder_only":
        return (TGT,), tgt
    return (SRC,), src


def _pair(**overrides):
    """(unscanned model, scanned model, unscanned params, the same params stacked)."""
    cfg = _config(**overrides)
    model = models.create_model(cfg)
    scanned = models.create_model(_config(**overrides, scan_layers=True))
    args, _ = _inputs(cfg.kind)
    params = _jit(model.init)(jax.random.key(0), *args)["params"]
    return model, scanned, params, stacking.stack_layers(params)


def _loss_fn(model, kind: str, *, deterministic: bool = True, rng=None):
    """params -> a scalar that every logit feeds into with its own weight."""
    args, kwargs = _inputs(kind)
    rngs = {} if rng is None else {"dropout": rng}

    def loss(params):
        logits = model.apply(
            {"params": params}, *args, **kwargs, deterministic=deterministic, rngs=rngs
        )
        weights = jnp.cos(jnp.arange(logits.size, dtype=jnp.float32)).reshape(logits.shape)
        return jnp.sum(logits.astype(jnp.float32) * weights)

    return loss


def _assert_trees_close(a, b, atol=1e-5):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Config and layouts.


def test_an_unknown_remat_policy_is_refused_in_one_line():
    with pytest.raises(errors.ConfigError, match="remat='sometimes' is not one of") as info:
        _config(remat="sometimes")
    assert "\n" not in str(info.value) and "dots_saveable" in str(info.value)


def test_default_layout_names_each_layer_and_remat_keeps_the_tree():
    args, _ = _inputs("encoder_decoder")
    params = jax.eval_shape(models.create_model(_config()).init, jax.random.key(0), *args)
    params = params["params"]
    assert [k for k in sorted(params["encoder"]) if k.startswith("layer")] == [
        "layer_0",
        "layer_1",
        "layer_2",
    ]
    assert stacking.SCANNED not in params["decoder"]
    args, _ = _inputs("decoder_only")
    trees = {
        remat: _jit(models.create_model(_config(kind="decoder_only", remat=remat)).init)(
            jax.random.key(0), *args
        )
        for remat in stacking.REMAT_POLICIES
    }
    for tree in trees.values():
        _assert_trees_close(tree, trees["none"], atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_stacked_params_have_the_scanned_models_structure(kind):
    _, scanned, _, stacked = _pair(kind=kind)
    args, _ = _inputs(kind)
    fresh = jax.eval_shape(scanned.init, jax.random.key(0), *args)["params"]
    assert jax.tree.structure(stacked) == jax.tree.structure(fresh)
    for x, y in zip(jax.tree.leaves(stacked), jax.tree.leaves(fresh), strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
    kernel = stacked["decoder" if kind != "encoder_only" else "encoder"]["layers"]["mlp"]
    assert kernel["wi"]["kernel"].shape[0] == (3 if kind != "encoder_decoder" else 2)


def test_a_scanned_stack_draws_each_layers_initial_weights_apart():
    _, scanned, _, _ = _pair(kind="decoder_only")
    args, _ = _inputs("decoder_only")
    params = _jit(scanned.init)(jax.random.key(0), *args)["params"]
    kernel = np.asarray(params["decoder"]["layers"]["self_attention"]["qkv"]["kernel"])
    assert kernel.shape[0] == 3
    assert not np.allclose(kernel[0], kernel[1]) and not np.allclose(kernel[1], kernel[2])


@pytest.mark.slow  # 4 s; a checkpoint restoring into the other layout stays default
def test_layout_round_trip_on_params_and_optimizer_state():
    _, _, params, stacked = _pair()
    assert stacked["encoder"]["layers"]["mlp"]["wi"]["kernel"].shape == (3, 16, 32)
    np.testing.assert_array_equal(
        stacked["encoder"]["layers"]["mlp"]["wi"]["kernel"][1],
        params["encoder"]["layer_1"]["mlp"]["wi"]["kernel"],
    )
    _assert_trees_close(stacking.unstack_layers(stacked), params, atol=0)
    _assert_trees_close(stacking.stack_layers(stacking.unstack_layers(stacked)), stacked, atol=0)
    optimizer = optax.adamw(1e-3, weight_decay=0.1)
    state = optimizer.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, state = optimizer.update(grads, state, params)
    stacked_state = stacking.stack_layers(state)
    # Adam is elementwise: updating stacked params from stacked moments is the same update.
    updates, _ = optimizer.update(stacking.stack_layers(grads), stacked_state, stacked)
    expected, _ = optimizer.update(grads, state, params)
    _assert_trees_close(updates, stacking.stack_layers(expected), atol=1e-7)
    _assert_trees_close(stacking.unstack_layers(stacked_state), state, atol=0)
    assert stacking.convert_layout(stacked, scan=True).keys() == stacked.keys()


def test_layer_keys_with_a_gap_are_refused():
    with pytest.raises(ValueError, match=r"layer_0 \.\. layer_"):
        stacking.stack_layers({"layer_0": {"w": jnp.ones(2)}, "layer_2": {"w": jnp.ones(2)}})


# ---------------------------------------------------------------------------------------------
# Same numbers.

VARIANTS = [
    dict(),
    dict(positional="relative"),
    dict(positional="alibi", num_kv_heads=2),
    dict(positional="rotary", norm_position="pre", norm="rmsnorm", activation="swiglu"),
    dict(positional="learned", window_radius=1, score="additive"),
]


def _variant_cases():
    """Every kind with relative positions by default; the other variants under `-m slow`."""
    for overrides in VARIANTS:
        name = ",".join(map(str, overrides.values())) or "default"
        marks = () if overrides == dict(positional="relative") else (pytest.mark.slow,)
        for kind in KINDS:
            yield pytest.param(kind, overrides, id=f"{kind}-{name}", marks=marks)


@pytest.mark.parametrize("kind, overrides", list(_variant_cases()))
def test_scanned_equals_unscanned_logits_and_gradients(kind, overrides):
    model, scanned, params, stacked = _pair(kind=kind, **overrides)
    loss, grads = _jit(jax.value_and_grad(_loss_fn(model, kind)))(params)
    scanned_loss, scanned_grads = _jit(jax.value_and_grad(_loss_fn(scanned, kind)))(stacked)
    # The scalar is a sum of +-weighted logits that largely cancel (0.17 from terms of order 1):
    # an absolute tolerance, as for the gradients (the ALiBi case differs by 4e-6 in float32).
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-5, atol=1e-5)
    _assert_trees_close(scanned_grads, stacking.stack_layers(grads))


# A window (`window_radius` r > 0) reaches every layer as an `attention.local.Window` holding
# arrays and, for relative / ALiBi positions, an offset-bias function over the stack's table:
# closed over by the scan body and by remat, never a scan argument.
WINDOW_CASES = [  # one in the default suite, the others under `-m slow`
    pytest.param(
        "decoder_only", "relative", "none", id="decoder_only-relative", marks=pytest.mark.slow
    ),
    pytest.param(
        "encoder_decoder", "alibi", "full", id="encoder_decoder-alibi-full", marks=pytest.mark.slow
    ),
    pytest.param("encoder_only", "rotary", "dots_saveable", id="encoder_only-rotary-dots"),
]


@pytest.mark.parametrize("kind, positional, remat", WINDOW_CASES)
def test_scanned_equals_unscanned_with_a_local_window(kind, positional, remat):
    model, _, params, stacked = _pair(kind=kind, positional=positional, window_radius=1)
    scanned = models.create_model(
        _config(kind=kind, positional=positional, window_radius=1, scan_layers=True, remat=remat)
    )
    args, kwargs = _inputs(kind)
    logits = model.apply({"params": params}, *args, **kwargs, deterministic=True)
    got = scanned.apply({"params": stacked}, *args, **kwargs, deterministic=True)
    np.testing.assert_allclose(got, logits, atol=1e-5, rtol=1e-5)
    # The window matters here: without it the logits differ.
    wide = models.create_model(_config(kind=kind, positional=positional))
    dense = wide.apply({"params": params}, *args, **kwargs, deterministic=True)
    assert not np.allclose(dense, logits, atol=1e-3)
    loss, grads = _jit(jax.value_and_grad(_loss_fn(model, kind)))(params)
    scanned_loss, scanned_grads = _jit(jax.value_and_grad(_loss_fn(scanned, kind)))(stacked)
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-5)
    _assert_trees_close(scanned_grads, stacking.stack_layers(grads))


def _dropout_outputs(model, params, kind, rng):
    """The "intermediates" of every Dropout module (`tfjax.nn.layers.Dropout`, flax's with a rate
    that may be traced): {path: [num_layers, ...] output}."""
    args, kwargs = _inputs(kind)
    _, state = model.apply(
        {"params": params},
        *args,
        **kwargs,
        deterministic=False,
        rngs={"dropout": rng},
        capture_intermediates=lambda module, _: isinstance(module, layers.Dropout),
        mutable=["intermediates"],
    )
    flat = jax.tree_util.tree_flatten_with_path(state["intermediates"]["decoder"]["layers"])[0]
    return {jax.tree_util.keystr(p): x for p, x in flat if "residual" in jax.tree_util.keystr(p)}


def test_scanned_dropout_draws_a_new_mask_for_every_layer():
    kind = "decoder_only"
    _, scanned, _, stacked = _pair(kind=kind, dropout_rate=0.5)
    outputs = _dropout_outputs(scanned, stacked, kind, jax.random.key(1))
    assert len(outputs) == 2  # the two residual dropouts (the feed-forward's rate is 0)
    for path, x in outputs.items():
        dropped = np.asarray(x == 0)  # [num_layers, B, L, D]
        assert dropped.shape[0] == 3, path
        assert 0.35 < dropped.mean() < 0.65, (path, dropped.mean())
        for i in range(1, 3):
            assert (dropped[i] != dropped[0]).mean() > 0.2, (path, i)
    again = _dropout_outputs(scanned, stacked, kind, jax.random.key(1))
    other = _dropout_outputs(scanned, stacked, kind, jax.random.key(2))
    for path, x in outputs.items():
        np.testing.assert_array_equal(again[path], x)
        assert not np.array_equal(other[path] == 0, x == 0)


def test_scanned_dropout_has_the_unscanned_statistics():
    # Per-layer rngs differ between the layouts (flax splits them in the scan), so compare
    # distributions: the mean and spread of the loss over dropout keys.
    kind = "decoder_only"
    model, scanned, params, stacked = _pair(kind=kind, dropout_rate=0.3)
    keys = jax.random.split(jax.random.key(3), 64)

    def losses(m, p):
        loss = lambda rng: _loss_fn(m, kind, deterministic=False, rng=rng)(p)  # noqa: E731
        return np.asarray(_jit(jax.vmap(loss))(keys))

    a, b = losses(model, params), losses(scanned, stacked)
    clean = _loss_fn(model, kind)(params)
    assert not np.allclose(a, clean) and not np.allclose(b, clean)
    spread = max(a.std(), b.std())
    assert abs(a.mean() - b.mean()) < 0.6 * spread, (a.mean(), b.mean(), spread)
    assert 0.5 < a.std() / b.std() < 2.0, (a.std(), b.std())


# ---------------------------------------------------------------------------------------------
# Remat.


@functools.cache
def _remat_loss_and_grads(scan: bool, remat: str):
    """Loss and gradients of a decoder-only model with dropout, the same weights and rng."""
    kind = "decoder_only"
    model = models.create_model(_config(kind=kind, dropout_rate=0.2, scan_layers=scan, remat=remat))
    args, _ = _inputs(kind)
    params = _jit(model.init)(jax.random.key(0), *args)["params"]
    loss = _loss_fn(model, kind, deterministic=False, rng=jax.random.key(4))
    return _jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize(
    "scan, remat",  # the full policy, scanned, in the default suite; the others under `-m slow`
    [
        pytest.param(scan, remat, marks=() if (scan, remat) == (True, "full") else pytest.mark.slow)
        for remat in stacking.REMAT_POLICIES[1:]
        for scan in (False, True)
    ],
)
def test_every_remat_policy_gives_the_loss_and_gradients_of_none(scan, remat):
    loss, grads = _remat_loss_and_grads(scan, "none")
    remat_loss, remat_grads = _remat_loss_and_grads(scan, remat)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    # Recomputed, the forward ops land in other fusions, whose float32 rounding may differ in
    # the last bits (1.5e-6 on gradients of 0.03 seen); a lost or wrong recompute is far larger.
    _assert_trees_close(remat_grads, grads, atol=5e-6)


def _checkpoint_eqns(jaxpr) -> list:
    """The jax.checkpoint equations of `jaxpr` and of the jaxprs inside it (scan, jit bodies)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("checkpoint", "remat2"):  # the primitive's name in jax 0.10
            found.append(eqn)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found += _checkpoint_eqns(inner)
    return found


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("remat", stacking.REMAT_POLICIES)
def test_each_layer_is_rematerialised_with_the_named_policy(scan, remat):
    kind = "decoder_only"
    model = models.create_model(_config(kind=kind, scan_layers=scan, remat=remat))
    args, kwargs = _inputs(kind)
    params = jax.eval_shape(model.init, jax.random.key(0), *args)["params"]
    jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, *args, **kwargs))(params)
    eqns = _checkpoint_eqns(jaxpr.jaxpr)
    if remat == "none":
        assert not eqns
        return
    assert len(eqns) == (1 if scan else 3)  # one per layer, or one in the scan's body
    expected = None if remat == "full" else getattr(jax.checkpoint_policies, remat)
    for eqn in eqns:
        assert eqn.params["policy"] is expected
        assert eqn.params["prevent_cse"] is (not scan)


@pytest.mark.slow
def test_remat_lowers_the_compiled_memory_of_a_scanned_backward_pass():
    # In a scan the recomputation sits in the backward loop's body. (Unscanned, XLA's CPU
    # scheduler runs the recomputed layers early and the saving disappears; see README.)
    fields = dict(TINY, kind="decoder_only", embed_dim=32, num_layers=3, mlp_dim=128)
    tokens = jnp.ones((4, 32), jnp.int32)

    def temp_bytes(remat: str) -> int:
        model = models.create_model(models.ModelConfig(**fields, scan_layers=True, remat=remat))
        params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
        loss = lambda p: model.apply({"params": p}, tokens).astype(jnp.float32).mean()  # noqa: E731
        compiled = jax.jit(jax.grad(loss)).lower(params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    sizes = {remat: temp_bytes(remat) for remat in stacking.REMAT_POLICIES}
    # Saving fewer activations needs less memory: nothing < weight matmuls < all matmuls < all.
    order = ["full", "dots_with_no_batch_dims_saveable", "dots_saveable", "none"]
    ordered = [sizes[k] for k in order]
    assert ordered == sorted(set(ordered)), sizes  # strictly increasing: a tie hides a policy
    assert sizes["full"] < 0.5 * sizes["none"], sizes


# ---------------------------------------------------------------------------------------------
# Cached decoding.


def test_scanned_cache_has_a_leading_layer_axis():
    model, scanned, params, stacked = _pair(kind="decoder_only")
    cache = decoding.init_cache(model, params, batch_size=2, max_length=7)
    scanned_cache = decoding.init_cache(scanned, stacked, batch_size=2, max_length=7)
    layer = scanned_cache["decoder"]["layers"]["self_attention"]
    assert layer["cached_key"].shape == (3, 2, 4, 7, 4)  # [layers, B, K, S, H]
    assert layer["cache_index"].shape == (3,)
    _assert_trees_close(scanned_cache, stacking.stack_layers(cache), atol=0)


@pytest.mark.parametrize(
    "positional",
    [
        "relative",
        pytest.param("sinusoidal", marks=pytest.mark.slow),
        pytest.param("rotary", marks=pytest.mark.slow),
    ],
)
def test_scanned_greedy_decoding_equals_unscanned(positional):
    # Encoder-decoder with source padding, and decoder-only with prompts of two lengths.
    model, scanned, params, stacked = _pair(positional=positional)
    source, segments = SRC, (SRC > 0).astype(jnp.int32)
    generate = functools.partial(decoding.generate, max_length=8, eos_id=-1)
    want = _jit(functools.partial(generate, model))(
        params, inputs=source, inputs_segment_ids=segments
    )
    got = _jit(functools.partial(generate, scanned))(
        stacked, inputs=source, inputs_segment_ids=segments
    )
    np.testing.assert_array_equal(got, want)
    model, scanned, params, stacked = _pair(kind="decoder_only", positional=positional)
    prompts = dict(prompts=TGT[:, :3], prompt_lengths=jnp.array([3, 2]))
    want = _jit(functools.partial(generate, model))(params, **prompts)
    got = _jit(functools.partial(generate, scanned))(stacked, **prompts)
    np.testing.assert_array_equal(got, want)


def test_scanned_greedy_decoding_with_a_window_equals_unscanned():
    # Cached steps take no Window: the cache mask carries the radius (p - j <= r) instead.
    model, scanned, params, stacked = _pair(
        kind="decoder_only", positional="alibi", window_radius=2
    )
    generate = functools.partial(decoding.generate, max_length=8, eos_id=-1)
    prompts = dict(prompts=TGT[:, :4], prompt_lengths=jnp.array([4, 2]))
    want = _jit(functools.partial(generate, model))(params, **prompts)
    got = _jit(functools.partial(generate, scanned))(stacked, **prompts)
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_scanned_beam_search_equals_unscanned():
    model, scanned, params, stacked = _pair(positional="relative")
    search = functools.partial(
        beam_search.beam_search, max_length=8, eos_id=3, beam_size=3, num_return=2
    )
    segments = (SRC > 0).astype(jnp.int32)
    want, want_scores = _jit(functools.partial(search, model))(
        params, SRC, inputs_segment_ids=segments
    )
    got, scores = _jit(functools.partial(search, scanned))(
        stacked, SRC, inputs_segment_ids=segments
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Checkpoints across layouts.


def _train_setup(scan: bool):
    """(initial train state, jitted train step) of a decoder-only model without dropout or
    biases: a key bias's gradient is rounding noise (softmax ignores a shift of a row's scores),
    which Adam turns into full steps that differ between the two layouts' programs."""
    kind = "decoder_only"
    model = models.create_model(_config(kind=kind, scan_layers=scan, use_bias=False))
    optimizer = optax.adam(1e-2)
    batch = {"targets": TGT, "targets_segment_ids": TGT_SEG, "targets_positions": TGT_POS}
    state = steps.create_train_state(model, optimizer, jax.random.key(0), batch, kind)
    step = steps.make_train_step(
        model, optimizer, lambda count: 1e-2, kind=kind, label_smoothing=0.1
    )
    return state, lambda state: _jit(step)(state, batch, jax.random.key(1))[0]


@pytest.mark.parametrize("saved_scan", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_checkpoint_restores_into_the_other_layout_and_training_goes_on(tmp_path, saved_scan):
    state, train_step = _train_setup(saved_scan)
    state = train_step(state)  # non-zero Adam moments
    saved_model = {"scan_layers": saved_scan}
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        checkpointer.save(
            1, state, rng=jax.random.key(0), data_state={}, config={"model": saved_model}
        )
    other_state, other_step = _train_setup(not saved_scan)
    config = _config(kind="decoder_only", scan_layers=not saved_scan, use_bias=False)
    with checkpointing.Checkpointer(tmp_path) as checkpointer:
        restored = checkpointer.restore(
            jax.eval_shape(lambda: other_state), convert=workdir_format.layout_conversion(config)
        )
    assert jax.tree.structure(restored.state) == jax.tree.structure(other_state)
    converted = stacking.convert_layout(state, scan=not saved_scan)
    _assert_trees_close(restored.state, converted, atol=0)
    # One more step in either layout: the same parameters, laid out differently.
    _assert_trees_close(
        other_step(restored.state), stacking.convert_layout(train_step(state), scan=not saved_scan)
    )
