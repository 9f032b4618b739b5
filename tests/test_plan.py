"""Ahead-of-time planning (`tfjax.runs.plan`, `experiments/plan.py`) against references built here.

The CPU path compiles for the 8 simulated devices of conftest.py (`cpu:8`) and is checked
against the real thing: parameter bytes against real arrays placed by the strategy, FSDP
against the shard counts, collectives against what data parallelism and FSDP must do, FLOPs
against 6 · N · tokens. The TPU path needs libtpu (the `tpu` extra) and skips without it.
Compiling takes seconds, so those tests are slow; the errors and the counting are not.
"""

import json
import math
import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import config_utils
from experiments.bench import mfu, workload
from tfjax import errors, models
from tfjax.data import datasets
from tfjax.models import flops, kinds, partitioning
from tfjax.parallel import costs, strategies, topology
from tfjax.runs import build, plan
from tfjax.training import steps

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Decoder-only, tied output; a 1024 x 32 token table (32,768 elements) is large enough for FSDP
# to shard (strategies.FSDP_MIN_SIZE), the layer weights (32 x 64 ...) are not.
TINY = ["model.vocab_size=1024", "train.global_batch_size=8"]
# The same family with matmuls that dominate the step, for the FLOPs checks.
SMALL = [*TINY, "model.embed_dim=128", "model.mlp_dim=512", "model.num_layers=2"]


def _config(overrides, mesh=None, devices=8):
    config = config_utils.load_config("configs/lm.py:tiny", overrides)
    return plan.apply_mesh(config, mesh, devices) if mesh else config


def _real_params(config):
    """The parameters of `config`'s model, initialised for real (arrays, not shapes)."""
    model_config = build.make_model_config(config, 0)
    model = models.create_model(model_config)
    rows = datasets.train_row_shapes(
        datasets.DataConfig(**config.data), kinds.get(model_config.kind)
    )
    sample = {k: jnp.zeros((1, *s), jnp.int32) for k, s in rows.items()}
    args, kwargs = steps.model_inputs(sample, model_config.kind)
    return model.init(jax.random.key(0), *args, **kwargs)["params"]


# ---------------------------------------------------------------------------------------------
# Errors: one line each, before anything compiles.


@pytest.mark.parametrize(
    "name, words",
    [
        ("v5e-16", ["unknown topology 'v5e-16'", "cpu:N", "v5e:4x4"]),
        ("gpu", ["unknown topology 'gpu'"]),
        ("v9:2x2", ["unknown chip 'v9'", "v5e"]),
        ("cpu:64", ["cpu:64 needs 64 CPU devices", "jax_num_cpu_devices=64"]),
    ],
)
def test_a_topology_that_cannot_be_planned_is_one_line(name, words):
    with pytest.raises(errors.ConfigError) as raised:
        topology.get_topology(name)
    for word in words:
        assert word in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unknown_chip_names_the_chips():
    with pytest.raises(errors.ConfigError, match="unknown chip 'tpu9': choose one of v4, v5e"):
        topology.get_topology("cpu:8", chip="tpu9")
    assert topology.get_topology("cpu:8", chip="v5e").chip.peak_flops == 197e12


@pytest.mark.parametrize(
    "mesh, words",
    [
        ("fsdp:3", ["does not divide the topology's 8 devices"]),
        ("data:2,fsdp:2", ["lays out 4 devices, the topology has 8"]),
        ("data:8,fsdp:2", ["lays out 16 devices"]),
        ("model:2", ["unknown axis 'model'", "data, fsdp, tensor"]),
        ("data=8", ["not AXIS:SIZE"]),
        ("fsdp:0", ["sizes >= 1"]),
    ],
)
def test_a_mesh_that_does_not_fit_the_topology_is_one_line(mesh, words):
    with pytest.raises(errors.ConfigError) as raised:
        _config(TINY, mesh)
    for word in words:
        assert word in str(raised.value)


def test_a_mesh_sets_the_parallel_group():
    config = _config(TINY, "fsdp:4")
    assert (config.parallel.mode, config.parallel.fsdp) == ("sharded", 4)
    assert _config(TINY, "data:8").parallel.fsdp == 1
    assert _config(TINY, "data:2,fsdp:4").parallel.fsdp == 4
    config = _config(TINY, "fsdp:2,tensor:2")
    assert (config.parallel.fsdp, config.parallel.tensor) == (2, 2)
    assert _config(TINY, "fsdp:4").parallel.tensor == 1
    pmap = [*TINY, "parallel.mode=pmap"]
    assert _config(pmap).parallel.mode == "pmap"  # without a mesh the config is left as it is


def test_a_batch_that_does_not_split_is_one_line():
    config = _config(["model.vocab_size=64", "train.global_batch_size=12"], "fsdp:2")
    with pytest.raises(errors.ConfigError, match="global_batch_size=12 does not split over the 8"):
        plan.plan(config, topology.get_topology("cpu:8"))


def test_a_vocabulary_only_the_data_knows_is_one_line():
    with pytest.raises(errors.ConfigError, match=r"--config\.model\.vocab_size=N"):
        plan.plan(_config([]), topology.get_topology("cpu:8"))


# ---------------------------------------------------------------------------------------------
# What the planner counts without compiling.


REVERSE = ["data.name=reverse", "data.num_train_examples=64", "data.num_eval_examples=8"]


# Files for the "files" source: a plain-text file (a text stream for LMs) and a TSV of pairs.
FILES_TEXT = ["data.name=files", "data.train_path={dir}/corpus.txt"]
FILES_TSV = ["data.name=files", "data.train_path={dir}/pairs.tsv", "data.eval_path={dir}/pairs.tsv"]
MLM = ["model.encoder_head=mlm", "data.tokenizer=word"]


@pytest.mark.parametrize(
    "spec, overrides",
    [
        ("configs/lm.py:tiny", []),  # "source | target" rows, packed
        ("configs/lm.py:tiny", ["data.pack=false"]),
        ("configs/lm.py:tiny", FILES_TEXT),  # a text stream from a file: windows, never packed
        ("configs/lm.py:tiny", FILES_TSV),  # pairs from a file, packed
        ("configs/shakespeare_char.py:tiny", ["data.dir={dir}"]),  # a text stream of a TEXT source
        ("configs/base.py:tiny", REVERSE),  # seq2seq, padded
        ("configs/base.py:tiny", [*REVERSE, "data.pack=true", "data.packed_source_len=24"]),
        ("configs/base.py:tiny", [*FILES_TSV, "data.pack=true"]),
        ("configs/classify.py:tiny", []),
        ("configs/classify.py:tiny", [*MLM, *REVERSE]),  # masked LM: each side a line
        ("configs/classify.py:tiny", [*MLM, *FILES_TEXT]),  # masked LM on a text stream
    ],
)
def test_row_shapes_are_those_of_the_loaded_data(spec, overrides, tmp_path, fake_corpus):
    """`train_row_shapes` (what `build` and the planner take the train state's sample from)
    gives each field of the first loaded training row, every field int32."""
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat\n" * 40)
    fake_corpus(tmp_path, {"tinyshakespeare/input.txt": "the cat sat on the mat\n" * 40})
    (tmp_path / "pairs.tsv").write_text("a b c\tc b a\nd e\te d\n" * 10)
    overrides = [o.format(dir=tmp_path) for o in overrides]
    config = config_utils.load_config(spec, overrides)
    data_config = datasets.DataConfig(**config.data)
    kind, head = config.model.kind, config.model.encoder_head
    loaded = datasets.load(
        data_config, kinds.get(kind), seed=0, workdir=tmp_path, encoder_head=head
    )
    row = loaded.train[0]
    assert {key: value.dtype for key, value in row.items()} == dict.fromkeys(row, np.int32)
    expected = {key: value.shape for key, value in row.items()}
    assert datasets.train_row_shapes(data_config, kinds.get(kind), head) == expected


def _encoder_decoder_formula(batch: int, shape: dict) -> int:
    """Train FLOPs of the encoder-decoder (shared embeddings, tied output, ReLU MLP) written
    from its shapes: 3 x the forward matmuls, per layer 2 x tokens x weights plus attention."""
    d, f, v = shape["embed_dim"], shape["mlp_dim"], shape["vocab_size"]
    s, t = shape["source_len"], shape["target_len"]
    encoder = shape["num_layers"] * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
    decoder = shape["num_decoder_layers"] * (
        2 * t * (4 * d * d + 2 * d * f)  # self-attention projections and the MLP
        + 2 * t * 2 * d * d  # cross-attention q and out, over the target
        + 2 * s * 2 * d * d  # cross-attention k and v, over the source
        + 4 * t * t * d  # QK^T and PV of self-attention
        + 4 * t * s * d  # ... of cross-attention
    )
    return 3 * batch * (encoder + decoder + 2 * t * d * v)  # + the tied output layer


def test_model_flops_match_the_formula_of_the_shapes():
    """The parameter-based count equals the formula written from the shapes independently."""
    shape = {**workload.SHAPE, "source_len": 48}  # S != L: the cross-attention reads S
    model = workload.create_model("float32", shape)
    data = {k: jnp.asarray(v) for k, v in workload.random_batch(2, shape).items()}
    variables = jax.eval_shape(
        lambda: model.init(jax.random.key(0), data["inputs"], data["targets"])
    )
    params = variables["params"]
    counted = flops.train_flops(
        model.config,
        params,
        batch=2,
        source_len=shape["source_len"],
        target_len=shape["target_len"],
    )
    assert counted == _encoder_decoder_formula(2, shape)
    assert mfu.train_flops(2, shape) == counted  # the benchmark counts with the same function
    tiny = dict(vocab_size=10, embed_dim=4, mlp_dim=8, num_layers=1, num_decoder_layers=1)
    tiny.update(num_heads=2, source_len=3, target_len=2, dropout_rate=0.0)
    # Written out for B=1: encoder 2*3*(64+64) + 4*9*4 = 912; decoder 2*2*128 + 2*2*32 +
    # 2*3*32 + 4*4*4 + 4*6*4 = 992; output 2*2*4*10 = 160; x 3 = 6,192.
    assert _encoder_decoder_formula(1, tiny) == 6192 == mfu.train_flops(1, tiny)


def test_the_1b_preset_has_tinyllamas_parameter_count():
    """TinyLlama 1.1B has 1,100,048,384 parameters; tfjax's output layer adds a bias of V."""
    config = config_utils.load_config("configs/lm.py:1b")
    model = models.create_model(build.make_model_config(config, 0))
    tokens = jnp.zeros((1, 8), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
    assert sum(x.size for x in jax.tree.leaves(params)) == 1_100_048_384 + 32_000


def test_collectives_are_read_from_hlo_text():
    text = "\n".join(
        [
            "%add (a: f32[], b: f32[]) -> f32[] {",
            "  ROOT %x = f32[] add(%a, %b)",
            "}",
            "%all-reduce-scatter.1 (input: f32[8,4]) -> f32[4,4] {",
            "  %all-reduce.9 = f32[8,4]{1,0:T(8,128)} all-reduce(%input), to_apply=%add",
            "}",
            "ENTRY %main (p: f32[8,4]) -> f32[4,4] {",
            "  %all-reduce = (f32[2,3]{1,0}, /*index=1*/bf16[4]{0}) all-reduce(%p, %q)",
            "  %ag = (f32[2]{0}, f32[4]{0}) all-gather-start(%p), dimensions={0}",
            "  %ag.1 = f32[4]{0} all-gather-done(%ag)",
            "  %fusion = f32[4,4]{1,0:T(4,128)} fusion(%p), kind=kCustom, "
            "calls=%all-reduce-scatter.1",
            "  %w = (s32[], f32[4]) while(%t), condition=%c, body=%b",
            '  ROOT %r = f32[4,4]{1,0} add(%fusion, %fusion), metadata={op_name="all-gather("}',
            "}",
        ]
    )
    assert costs.collectives(text) == {
        "all-reduce": {"count": 1, "bytes": 2 * 3 * 4 + 4 * 2},
        "all-gather": {"count": 1, "bytes": 16},
        "reduce-scatter": {"count": 1, "bytes": 64},
    }
    assert costs.loops(text) == 1


# ---------------------------------------------------------------------------------------------
# The CPU path: compiled for 8 simulated devices (slow: seconds per compile).


@pytest.fixture(scope="module")
def cpu_plans():
    """{fsdp: Plan} of TINY on cpu:8: the config's pmap mode (fsdp 1), and fsdp 2 and 4."""
    cpu8 = topology.get_topology("cpu:8", chip="v5e")
    plans = {1: plan.plan(_config([*TINY, "parallel.mode=pmap"]), cpu8)}
    for fsdp in (2, 4):
        plans[fsdp] = plan.plan(_config(TINY, f"fsdp:{fsdp}"), cpu8)
    return plans


def _placed_bytes(tree, fsdp, tensor=1):
    """Bytes device 0 holds when the real `tree` is placed as training places it."""
    strategy = strategies.Sharded(fsdp, tensor=tensor, logical_axes=partitioning.state_axes)
    placed = jax.device_put(tree, strategy.shardings(jax.eval_shape(lambda: tree)))
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(placed))


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [1, 2, 4])
def test_state_bytes_are_those_of_the_real_sharded_state(cpu_plans, fsdp):
    config = _config(TINY)
    params = _real_params(config)
    optimizer, _ = build.make_optimizer(config, build.make_model_config(config, 0))
    assert cpu_plans[fsdp].params_bytes == _placed_bytes(params, fsdp)
    assert cpu_plans[fsdp].opt_state_bytes == _placed_bytes(optimizer.init(params), fsdp)
    assert cpu_plans[fsdp].mesh == {"data": 8 // fsdp, "fsdp": fsdp, "tensor": 1}
    # The donated state (and its int32 step) is held once in the peak: beside it the batch and
    # a few hundred bytes of key, metrics and output tables; then the scratch space.
    planned = cpu_plans[fsdp]
    state = planned.params_bytes + planned.opt_state_bytes + 4
    assert planned.memory.aliased == state
    rest = planned.memory.peak - planned.memory.temporaries - planned.memory.code
    assert 0 < rest - state - planned.batch_bytes < 1024


@pytest.mark.slow
def test_fsdp_divides_the_bytes_of_the_sharded_parameters(cpu_plans):
    """Leaves FSDP shards (large, with a dimension the axis divides) shrink by the axis size;
    the rest stay whole. Adam keeps two moments per parameter: twice the parameter bytes, and
    two int32 step counts (Adam's and the schedule's)."""
    leaves = jax.tree.leaves(_real_params(_config(TINY)))
    sharded = sum(x.nbytes for x in leaves if x.size >= strategies.FSDP_MIN_SIZE)
    whole = sum(x.nbytes for x in leaves) - sharded
    assert sharded > whole > 0
    for fsdp in (1, 2, 4):
        assert cpu_plans[fsdp].params_bytes == whole + sharded // fsdp
        assert cpu_plans[fsdp].opt_state_bytes == 2 * (whole + sharded // fsdp) + 2 * 4
    assert cpu_plans[1].memory.arguments > cpu_plans[2].memory.arguments


@pytest.mark.slow
def test_collectives_are_those_of_data_parallelism_and_fsdp(cpu_plans):
    data_parallel = cpu_plans[1].collectives
    assert set(data_parallel) == {"all-reduce"}  # gradients summed over the replicas
    assert data_parallel["all-reduce"]["bytes"] >= cpu_plans[1].params_bytes  # all of them
    for fsdp in (2, 4):
        found = cpu_plans[fsdp].collectives
        assert "all-gather" in found  # sharded parameters gathered for the forward pass
        assert "all-reduce" in found or "reduce-scatter" in found  # and gradients reduced


@pytest.mark.slow
def test_tensor_parallelism_splits_the_layers_and_reduces_activations(cpu_plans):
    """--mesh=tensor:2 on cpu:8: the mesh is (data 4, fsdp 1, tensor 2); device 0 holds half of
    every head and MLP matrix (the real parameters placed by training's strategy say how
    much), the token table whole; the program sums the partial outputs of the split layers."""
    config = _config(TINY, "tensor:2")
    assert (config.parallel.tensor, config.parallel.fsdp) == (2, 1)
    result = plan.plan(config, topology.get_topology("cpu:8"))
    assert result.mesh == {"data": 4, "fsdp": 1, "tensor": 2}
    params = _real_params(config)
    assert result.params_bytes == _placed_bytes(params, 1, tensor=2)
    split = ("heads", "qkv_heads", "mlp")  # the default rules' tensor-split names
    axes = jax.tree.leaves(partitioning.logical_axes(params), is_leaf=lambda x: type(x) is tuple)
    halved = sum(
        x.nbytes
        for x, names in zip(jax.tree.leaves(params), axes, strict=True)
        if set(names) & set(split)
    )
    assert halved > 0
    assert result.params_bytes == cpu_plans[1].params_bytes - halved // 2
    assert "all-reduce" in result.collectives
    assert (
        result.collectives["all-reduce"]["count"] > cpu_plans[1].collectives["all-reduce"]["count"]
    )


@pytest.mark.slow
def test_pmap_is_planned_as_its_jit_twin(cpu_plans):
    assert cpu_plans[1].notes and "pmap" in cpu_plans[1].notes[0]
    assert not plan.plan(_config(TINY), topology.get_topology("cpu:8")).notes  # sharded: none


@pytest.mark.slow
def test_flops_per_step_match_six_n_tokens():
    """Decoder-only with a tied output: every parameter but norms and biases multiplies each
    target token once (the token table as the output layer), so 6 · N · tokens is the matmul
    count up to attention; XLA's count adds softmax, norms and the optimizer update."""
    config = _config(SMALL, "fsdp:2")
    result = plan.plan(config, topology.get_topology("cpu:8"))
    params = _real_params(config)
    n = sum(x.size for x in jax.tree.leaves(params))
    tokens = 8 * config.data.max_target_len
    reference = 6 * n * tokens
    assert result.num_params == n and result.tokens_per_step == tokens
    assert abs(result.model_flops / reference - 1) < 0.05
    assert abs(result.compiled_flops / reference - 1) < 0.15
    assert result.compiled_flops > result.model_flops  # XLA counts the model and more


@pytest.mark.slow
def test_the_report_and_json_hold_the_numbers(cpu_plans):
    result = cpu_plans[2]
    lines = plan.report(result, "configs/lm.py:tiny")
    text = "\n".join(lines)
    expected = ["mesh data 4 x fsdp 2", "parameters", "optimizer state", "temporaries"]
    expected += ["of 14.90 GiB HBM: fits", "all-gather", "roofline", "not measurements"]
    for words in expected:
        assert words in text, text
    as_json = json.loads(json.dumps(result.to_dict()))
    assert as_json["fits"] is True and as_json["roofline"]["bound"] in ("compute", "memory")
    bound = result.roofline
    per_device_flops = max(result.compiled_flops, result.model_flops) / 8
    assert math.isclose(bound["compute_s"], per_device_flops / 197e12)
    assert math.isclose(bound["memory_s"], result.bytes_accessed / 819e9)


# ---------------------------------------------------------------------------------------------
# The command line (slow: a fresh Python with JAX per run).


def _run(args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the tool makes its own simulated devices for cpu:N
    return subprocess.run(
        [sys.executable, "-m", "experiments.plan", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_command_plans_a_cpu_topology():
    overrides = [f"--config.{o}" for o in TINY]
    args = ["--topology=cpu:8", "--mesh=fsdp:2", "--chip=v5e", "--json"]
    done = _run(["--config=configs/lm.py:tiny", *overrides, *args])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["devices"] == 8 and result["mesh"] == {"data": 4, "fsdp": 2, "tensor": 1}
    assert result["fits"] is True and "all-gather" in result["collectives"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, words",
    [
        (["--topology=v5e-16"], ["unknown topology 'v5e-16'"]),
        (["--topology=cpu:8", "--mesh=fsdp:3"], ["does not divide the topology's 8 devices"]),
        (["--topology=cpu:8", "--chip=tpu9"], ["unknown chip 'tpu9'"]),
        (["--topology=v9:2x2"], ["unknown chip 'v9'"]),
        ([], ["missing --topology"]),
    ],
)
def test_a_command_line_error_is_one_line_with_status_2(args, words):
    done = _run(["--config=configs/lm.py:tiny", *args])
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0]


# ---------------------------------------------------------------------------------------------
# The TPU path: libtpu's compile-only devices.


@pytest.fixture(scope="module")
def libtpu():
    pytest.importorskip("libtpu", reason='libtpu is not installed: pip install -e ".[tpu]"')
    # Before libtpu first loads here: another process on the machine may hold its TPU lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@pytest.mark.slow
def test_a_tpu_slice_compiles_for_its_devices(libtpu):
    slice_ = topology.get_topology("v5e:2x2")
    assert len(slice_.devices) == 4 and slice_.devices[0].device_kind == "TPU v5 lite"
    result = plan.plan(_config(TINY, "fsdp:2", devices=4), slice_)
    assert result.devices == 4 and result.chip.name == "v5e"
    assert result.mesh == {"data": 2, "fsdp": 2, "tensor": 1}
    assert result.fits and result.roofline["step_s"] > 0
    assert "all-gather" in result.collectives and "reduce-scatter" in result.collectives
    params = _real_params(_config(TINY))
    leaves = jax.tree.leaves(params)
    sharded = sum(x.nbytes for x in leaves if x.size >= strategies.FSDP_MIN_SIZE)
    assert result.params_bytes == sum(x.nbytes for x in leaves) - sharded // 2


@pytest.mark.slow
def test_megacore_chips_are_one_device_each(libtpu):
    for name, devices in (("v4:2x2x1", 4), ("v5p:2x2x2", 8)):
        slice_ = topology.get_topology(name)
        assert len(slice_.devices) == devices == slice_.chips and slice_.devices_per_chip == 1


@pytest.mark.slow
def test_a_chip_overrides_the_datasheet_not_the_layout(libtpu):
    slice_ = topology.get_topology("v5e:2x2", chip="v4")  # v4's megacore layout would fail
    assert slice_.chip.name == "v4" and slice_.devices[0].device_kind == "TPU v5 lite"


@pytest.mark.slow
def test_libtpu_refusals_are_one_line(libtpu):
    with pytest.raises(errors.ConfigError, match="libtpu refuses it") as raised:
        topology.get_topology("v5e:3x3")
    assert "\n" not in str(raised.value)
    done = _run(["--config=configs/lm.py:tiny", "--topology=v5e:3x3"])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr


@pytest.mark.parametrize(
    "message, error, words",
    [
        ("JAX TPU support not installed; cannot generate TPU topology.", errors.DependencyError,
         'pip install "tfjax[tpu]"'),
        ("ABORTED: Internal error when accessing libtpu multi-process lockfile.", errors.UserError,
         "ALLOW_MULTIPLE_LIBTPU_LOAD=1"),
        ('INVALID_ARGUMENT: Topology layout "v5e:3x3" is not divisible\nby', errors.ConfigError,
         "libtpu refuses it: INVALID_ARGUMENT: Topology layout \"v5e:3x3\" is not divisible by"),
    ],
)  # fmt: skip
def test_what_libtpu_says_becomes_one_line(monkeypatch, message, error, words):
    from jax._src import xla_bridge

    def refuse(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(xla_bridge, "make_pjrt_tpu_topology", refuse)
    with pytest.raises(error) as raised:
        topology.get_topology("v5e:3x3")
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_libtpus_start_up_notices_are_dropped_and_nothing_else(capfd):
    from experiments import plan as plan_cli

    with plan_cli._without_libtpu_notices():
        os.write(2, b"Failed to find host bounds: WARNING: could not determine TPU accelerator ")
        os.write(2, b"type, please set env var `TPU_ACCELERATOR_TYPE` manually\nsomething else\n")
    assert capfd.readouterr().err == "something else\n"


# `jax.Device.device_kind` of real devices, and the chip whose datasheet applies.
DEVICE_KINDS = {
    "TPU v4": "v4",
    "TPU v5 lite": "v5e",
    "TPU v5": "v5p",
    "TPU v6 lite": "v6e",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100_pcie",
    "NVIDIA H200": "h200",
    "NVIDIA A100-SXM4-80GB": "a100",
}


@pytest.mark.parametrize("kind, name", DEVICE_KINDS.items())
def test_bench_and_planner_report_the_same_peak(kind, name):
    planned = topology.get_topology("cpu:1", chip=name).chip  # what `--chip=NAME` plans with
    assert topology.chip_of(kind) is planned
    assert mfu.datasheet_peak(kind, "bfloat16") == planned.peak_flops
    assert mfu.datasheet_peak(kind, "float32") is None and topology.chip_of("cpu") is None


def test_chips_table_is_per_chip_datasheet_numbers():
    for chip in topology.CHIPS.values():
        assert 1e14 < chip.peak_flops < 2e15 and 8e9 < chip.hbm_bytes < 2e11
        assert 5e11 < chip.hbm_bandwidth < 5e12
    assert np.isclose(topology.CHIPS["v5e"].hbm_bandwidth, 819e9)


def test_a_step_the_compiler_cannot_fit_is_one_line_with_the_fixes():
    """TPU compilers refuse a program whose buffers exceed HBM (seen for configs/lm.py:1b on
    v5e:2x2): the plan says so in one line, with the state's share and what to change."""
    said = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (54.72G) exceeds available HBM (15.75G)."
    )

    class Lowered:
        def compile(self):
            raise jax.errors.JaxRuntimeError(said)

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    matrix = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=one)
    state = types.SimpleNamespace(params={"w": matrix}, opt_state={"mu": matrix})
    with pytest.raises(errors.ConfigError) as caught:
        plan._compile(Lowered(), state, "v5e:2x2")
    text = str(caught.value)
    assert text.startswith("the step does not fit v5e:2x2: Ran out of memory on HBM")
    assert "(54.72G) exceeds available HBM (15.75G)" in text
    assert "parameters take 4.00 MiB and the optimizer state 4.00 MiB" in text
    assert "model.scan_layers=true with model.remat=full" in text and "\n" not in text

    class Broken:
        def compile(self):
            raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
        plan._compile(Broken(), state, "v5e:2x2")


def test_the_peak_counts_a_donated_state_once():
    """A step that donates its state (as the train step does) writes the new state into the
    state's buffers: the peak holds the state once, the batch, the outputs that are not the
    state (a scalar loss and the output tuple's index table) and the scratch space."""
    state = {
        "w": jnp.zeros((64, 32), jnp.float32),
        "m": jnp.zeros((64, 32), jnp.float32),
        "step": jnp.zeros((), jnp.int32),
    }
    batch = jnp.zeros((16, 64), jnp.float32)

    def step(state, batch):
        grad = jax.grad(lambda w: jnp.mean((batch @ w) ** 2))(state["w"])
        m = 0.9 * state["m"] + grad
        new = {"w": state["w"] - 0.1 * m, "m": m, "step": state["step"] + 1}
        return new, jnp.mean((batch @ state["w"]) ** 2)

    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
    memory = costs.memory(compiled)
    state_bytes = 2 * 64 * 32 * 4 + 4
    assert memory.arguments == state_bytes + 16 * 64 * 4 and memory.aliased == state_bytes
    held = state_bytes + 16 * 64 * 4 + 4  # the state, the batch, the loss
    rest = memory.peak - memory.temporaries - memory.code
    assert held <= rest <= held + 64  # + the output tuple's pointers
