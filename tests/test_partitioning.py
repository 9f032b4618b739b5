"""Logical axis names of every parameter (`tfjax.models.partitioning`) and the layout rules
(`tfjax.parallel.layout`), checked without running a step: every model variant's parameters
are named, an unknown one is refused, and a layout that does not divide fails in
`check_config` with the parameter, its shape and the fix."""

import jax
import jax.numpy as jnp
import pytest
import test_workdir_format
from jax.sharding import PartitionSpec as P

from experiments import config_utils
from tfjax import errors, models
from tfjax.models import partitioning
from tfjax.parallel import layout
from tfjax.runs import validation, workdir_format
from tfjax.training import optim

TINY = dict(vocab_size=24, embed_dim=16, num_layers=1, num_decoder_layers=1, mlp_dim=32)
VARIANTS = {
    "encoder_decoder": {},
    "gqa_unfused_relative_swiglu_rmsnorm_untied": dict(
        num_heads=4,
        num_kv_heads=2,
        fused_qkv=False,
        positional="relative",
        activation="swiglu",
        norm="rmsnorm",
        norm_position="pre",
        share_embeddings=False,
        tie_output=False,
    ),
    "low_rank_value_fused": dict(value_rank=2),
    "low_rank_value_unfused": dict(value_rank=2, fused_qkv=False),
    "learned_concat_additive": dict(
        positional="learned", positional_combine="concat", positional_dim=4, score="additive"
    ),
    "general_score_no_bias": dict(score="general", use_bias=False),
    "encoder_classify": dict(kind="encoder_only", positional="learned"),
    "encoder_mlm_untied": dict(kind="encoder_only", encoder_head="mlm", tie_output=False),
    "encoder_mlm_tied": dict(kind="encoder_only", encoder_head="mlm"),
    "encoder_mlm_bert_options": dict(
        kind="encoder_only",
        encoder_head="mlm",
        num_token_types=2,
        embedding_norm=True,
        output_bias="on",
    ),
    "decoder_mqa_rotary_untied": dict(
        kind="decoder_only", positional="rotary", num_kv_heads=1, tie_output=False
    ),
    "decoder_gelu_alibi_final_norm": dict(
        kind="decoder_only", activation="gelu", positional="alibi", final_norm=True
    ),
    # Scanned stacks: every layer parameter gains a leading "layers" axis.
    "encoder_decoder_scanned_relative": dict(scan_layers=True, positional="relative"),
    "decoder_scanned_gqa": dict(kind="decoder_only", scan_layers=True, num_kv_heads=1),
}


def _names(axes) -> list[tuple[str, ...]]:
    """The axis-name tuples of a tree from `logical_axes` / `state_axes`, in leaf order."""
    is_names = lambda x: isinstance(x, tuple) and all(isinstance(n, str) for n in x)  # noqa: E731
    return jax.tree.leaves(axes, is_leaf=is_names)


def _params(**fields):
    return validation.abstract_params(models.ModelConfig(**{"num_heads": 2, **TINY, **fields}))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_parameter_of_every_variant_has_logical_axes_of_its_rank(variant):
    params = _params(**VARIANTS[variant])
    axes = partitioning.logical_axes(params)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    named = _names(axes)
    assert len(named) == len(flat)
    for (path, x), names in zip(flat, named, strict=True):
        assert len(names) == x.ndim, (path, names)
        assert set(names) <= set(partitioning.LOGICAL_AXES), (path, names)


def test_the_table_names_the_megatron_dimensions():
    params = _params(fused_qkv=False)["encoder"]["layer_0"]
    axes = partitioning.logical_axes(params)
    assert axes["self_attention"]["query"]["kernel"] == ("embed", "heads", "kv")
    assert axes["self_attention"]["out"]["kernel"] == ("heads", "kv", "embed")
    assert axes["mlp"]["wi"]["kernel"] == ("embed", "mlp")
    assert axes["mlp"]["wo"]["kernel"] == ("mlp", "embed")


def test_an_unknown_parameter_is_refused_with_its_path_and_shape():
    params = {"encoder": {"layer_0": {"adapter": {"kernel": jnp.zeros((16, 4))}}}}
    path = r"encoder/layer_0/adapter/kernel of shape \(16, 4\)"
    with pytest.raises(errors.ConfigError, match=path):
        partitioning.logical_axes(params)
    with pytest.raises(errors.ConfigError, match=r"TABLE in tfjax/models/partitioning\.py"):
        partitioning.logical_axes({"mlp": {"wi": {"kernel": jnp.zeros((2, 3, 4))}}})  # rank 3


def test_state_axes_follow_the_parameters_into_adams_moments():
    params = _params()
    optimizer, _ = optim.make_optimizer(optim.OptimConfig(), 16)
    opt_state = jax.eval_shape(optimizer.init, params)
    axes = partitioning.state_axes(opt_state)
    # Adam's mu and nu; the step counters have none
    assert _names(axes) == 2 * _names(partitioning.logical_axes(params))


def test_default_rules_split_heads_and_mlp_then_fsdp_takes_the_rest():
    rules = layout.check_rules(layout.DEFAULT_RULES)
    sizes = {"data": 1, "fsdp": 2, "tensor": 4}
    query = layout.param_spec("q", (512, 8, 64), ("embed", "heads", "kv"), rules, sizes, 1)
    assert query == P("fsdp", "tensor", None)
    wo = layout.param_spec("wo", (2048, 512), ("mlp", "embed"), rules, sizes, 1)
    assert wo == P("tensor", "fsdp")
    norm = layout.param_spec("scale", (512,), ("embed",), rules, sizes, 2**14)
    assert norm == P()  # small: replicated
    single = {"data": 8, "fsdp": 1, "tensor": 1}
    assert layout.param_spec("q", (512, 8, 64), ("embed", "heads", "kv"), rules, single, 1) == P()
    # A tensor axis of size 1 splits nothing: FSDP alone lays out the arrays it always did.
    assert layout.param_spec("wo", (2048, 512), ("mlp", "embed"), rules, {"fsdp": 4}, 1) == P(
        "fsdp", None
    )
    assert layout.batch_spec(rules) == P(("data", "fsdp"))


def test_rules_read_back_from_json_are_normalised():
    as_json = [["batch", ["data", "fsdp"]], ["heads", "tensor"], ["mlp", ["tensor"]]]
    assert layout.normalize_rules(as_json) == (
        ("batch", ("data", "fsdp")),
        ("heads", "tensor"),
        ("mlp", "tensor"),
    )


def _config(overrides, spec="configs/lm.py:tiny"):
    return config_utils.load_config(spec, ["model.vocab_size=64", *overrides])


SHARDED = ["parallel.mode=sharded"]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            [*SHARDED, "parallel.tensor=4", "model.num_heads=6", "model.embed_dim=48"],
            ["decoder/layer_0/self_attention/out/kernel of shape (6, 8, 48)",
             "'heads' dimension (6)", "tensor=4", "a parallel.tensor that divides 6",
             "('heads', None)"],
        ),
        (
            [*SHARDED, "parallel.tensor=4", "model.num_heads=4", "model.num_kv_heads=2",
             "model.fused_qkv=false"],
            ["self_attention/key/bias of shape (2, 8)", "'kv_heads' dimension (2)"],
        ),
        (
            [*SHARDED, "parallel.tensor=3"],
            ["mlp/wi/bias of shape (64,)", "tensor=3"],
        ),
        (
            [*SHARDED, "parallel.rules=(('heads', 'model'),)"],
            ["maps 'heads' to mesh axis 'model'", "data, fsdp, tensor"],
        ),
        (
            [*SHARDED, "parallel.rules=(('hidden', 'tensor'),)"],
            ["logical axis 'hidden'", "mlp"],
        ),
        (["parallel.mode=pmap", "parallel.tensor=2"],
         ["parallel.tensor=2 needs --config.parallel.mode=sharded"]),
        ([*SHARDED, "parallel.tensor=0"], ["parallel.tensor must be an integer >= 1"]),
    ],
)  # fmt: skip
def test_an_invalid_layout_fails_when_the_config_is_checked(overrides, words):
    with pytest.raises(errors.ConfigError) as raised:
        validation.check_config(_config(overrides))
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_valid_layout_passes_and_rules_override_from_the_command_line():
    validation.check_config(_config([*SHARDED, "parallel.tensor=2", "parallel.fsdp=2"]))
    overrides = [*SHARDED, "parallel.tensor=4", "model.num_heads=4", "model.num_kv_heads=2"]
    overrides += ["model.fused_qkv=false", "parallel.rules=(('heads','tensor'),('kv_heads',None))"]
    config = _config(overrides)
    assert config.parallel.rules == (("heads", "tensor"), ("kv_heads", None))
    validation.check_config(config)  # key/value heads replicated: nothing left to divide


def test_a_workdir_from_before_tensor_parallelism_is_refused_in_one_line(tmp_path):
    config = _config([])
    as_dict = workdir_format.config_dict(config)
    as_dict["parallel"]["mode"] = "pmap"  # the default when tensor and rules did not exist
    del as_dict["parallel"]["tensor"], as_dict["parallel"]["rules"]
    test_workdir_format.write_older(tmp_path / "config.json", as_dict)
    test_workdir_format.assert_refused(tmp_path / "config.json")


def test_a_scanned_stack_adds_a_layers_axis_that_no_rule_or_fsdp_splits():
    params = _params(num_layers=3, num_decoder_layers=3, scan_layers=True)
    axes = partitioning.logical_axes(params)
    assert axes["encoder"]["layers"]["mlp"]["wi"]["kernel"] == ("layers", "embed", "mlp")
    assert axes["embed"]["embedding"] == ("vocab", "embed")  # outside the stack: as before
    rules = layout.check_rules(layout.DEFAULT_RULES)
    # [layers=3, D=16, F=32] with fsdp 3: the layer axis is the only one fsdp divides.
    spec = layout.param_spec("wi", (3, 16, 32), ("layers", "embed", "mlp"), rules, {"fsdp": 3}, 1)
    assert spec == P()
    spec = layout.param_spec("wi", (3, 16, 32), ("layers", "embed", "mlp"), rules, {"tensor": 2}, 1)
    assert spec == P(None, None, "tensor")
