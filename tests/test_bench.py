"""Tests of the benchmark harness (`experiments/bench/`) and its peers (`torch_peer.py`,
`flax_peer.py`).

Only tiny shapes: the benchmark shape itself is never run here.
"""

import importlib
import itertools
import json
import math
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from experiments import cli
from experiments.bench import (
    decode,
    depth,
    environment,
    flax_peer,
    mfu,
    residual,
    rss,
    suite,
    timing,
    torch_peer,
    train,
    workload,
)
from tfjax import models

# V, D, 1 + 1 layers, B = 2, S = L = 8: the same fields as `workload.SHAPE`.
TINY = dict(
    vocab_size=50,
    embed_dim=16,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    mlp_dim=32,
    dropout_rate=0.1,
    batch=2,
    source_len=8,
    target_len=8,
)


@pytest.mark.parametrize("peer", ["", "torch", "flax"])
def test_check_peer_accepts_known_peers(peer):
    suite.check_peer(peer, ["train", "decode"])


def test_the_flax_peer_compares_train_or_decode():
    suite.check_peer("flax", ["decode"])
    with pytest.raises(cli.UsageError, match="train and decode"):
        suite.check_peer("flax", ["attention"])


@pytest.mark.parametrize("peer", ["jax", "Torch", "tensorflow"])
def test_check_peer_rejects_unknown_peers(peer):
    with pytest.raises(cli.UsageError, match="torch"):
        suite.check_peer(peer, ["train"])


def test_check_peer_needs_the_train_bench():
    with pytest.raises(cli.UsageError, match="train"):
        suite.check_peer("torch", ["decode"])


@pytest.mark.parametrize(
    "benches, warmup, match",
    [(["train", "speed"], 1, "speed"), (["decode"], 0, "warmup")],
)
def test_check_options_rejects_unknown_benches_and_no_warmup(benches, warmup, match):
    with pytest.raises(cli.UsageError, match=match):
        suite.check_options(benches, "", warmup)


@pytest.mark.parametrize("cache_start, loops", [(0, 1), (2, 3)])
def test_the_decode_bench_passes_cache_start_to_both_cached_decoders(cache_start, loops):
    # target_len 8: cache_start 2 decodes over caches of 2, 4 and 8 slots, one loop each.
    shape = {**TINY, "target_len": 8}
    model = workload.create_model("float32", shape)
    data = workload.random_batch(2, shape)
    params = jax.eval_shape(model.init, jax.random.key(0), data["inputs"], data["targets"])
    src, seg = jnp.asarray(data["inputs"]), jnp.asarray(data["inputs_segment_ids"])
    variants = decode._variants(model, src, seg, 8, cache_start)
    for name in ("greedy_cached", "beam4"):
        jaxpr = jax.make_jaxpr(variants[name])(params["params"])
        assert str(jaxpr).count("while[") == loops, name


def test_importing_the_command_line_defines_no_flags():
    # `python -m experiments.bench` defines them; an import (tests, Colab) must not.
    importlib.import_module("experiments.bench.__main__")
    assert "repeats" not in flags.FLAGS and "bench" not in flags.FLAGS


def test_require_torch_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(ImportError, match=r"tfjax\[parity\]"):
        torch_peer.require_torch()


def test_batch_ids_and_segments():
    data = workload.random_batch(TINY["batch"], TINY)
    assert data["inputs"].shape == (2, 8) and data["targets"].shape == (2, 8)
    for key in ("inputs", "targets"):
        assert data[key].dtype == np.int32
        assert data[key].min() >= 3 and data[key].max() < TINY["vocab_size"]
    assert (data["inputs_segment_ids"] == 1).all() and (data["targets_segment_ids"] == 1).all()


def test_sinusoid_table_matches_the_paper():
    table = torch_peer.sinusoid_table(5, 8)  # [L, D]
    for pos in range(5):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            np.testing.assert_allclose(table[pos, 2 * i], math.sin(angle), atol=1e-6)
            np.testing.assert_allclose(table[pos, 2 * i + 1], math.cos(angle), atol=1e-6)


def test_torch_has_final_norms_on_top_of_tfjax_parameters():
    pytest.importorskip("torch", reason="the torch peer needs the 'parity' extra")
    fields = {k: v for k, v in TINY.items() if k not in ("batch", "source_len", "target_len")}
    model = models.create_model(models.ModelConfig(**fields))
    tokens = jax.ShapeDtypeStruct((2, 8), np.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)["params"]
    tfjax_count = sum(x.size for x in jax.tree.leaves(params))
    # Two extra LayerNorms (scale and bias of width D) end torch's encoder and decoder stacks.
    assert torch_peer.num_params(TINY) == tfjax_count + 4 * TINY["embed_dim"]


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: on a busy machine torch's spinning OpenMP workers slow tiny steps
    by 100x (0.6 s instead of 5 ms on 2 shared cores); the benchmark itself keeps the default."""
    torch = pytest.importorskip("torch", reason="the torch peer needs the 'parity' extra")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_torch_train_step_loss_is_finite_and_decreases(one_torch_thread):
    step = torch_peer.make_train_step(
        TINY, workload.random_batch(TINY["batch"], TINY), learning_rate=3e-3
    )
    losses = [step() for _ in range(20)]
    assert all(isinstance(loss, float) and math.isfinite(loss) for loss in losses)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses


def test_flax_peer_has_the_parameters_of_the_tfjax_model():
    data = workload.random_batch(TINY["batch"], TINY)
    _, tfjax_params = workload.make_train_step(data, "float32", TINY)
    assert flax_peer.num_params(TINY) == tfjax_params


def test_flax_peer_sinusoids_are_the_tfjax_table():
    from tfjax.nn import positional

    table = positional.sinusoidal_table(12, 16)  # tfjax's default layout: sin/cos interleaved
    np.testing.assert_allclose(flax_peer.sinusoids(12, 16), table, atol=1e-6)


def test_flax_train_step_loss_is_finite_and_decreases():
    step = flax_peer.make_train_step(
        TINY, workload.random_batch(TINY["batch"], TINY), learning_rate=3e-3
    )
    losses = [float(step()) for _ in range(20)]
    assert all(math.isfinite(loss) for loss in losses)
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.5, losses


@pytest.mark.slow  # 3-5 s; benchmark plumbing, not the library
def test_flax_peer_cached_greedy_is_uncached_greedy():
    data = workload.random_batch(TINY["batch"], TINY)
    model = flax_peer.build_model(TINY)
    params = flax_peer.init_params(model, data)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    params = jax.tree.unflatten(  # away from the init, where every row predicts one token
        tree, [x + jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )
    tokens = np.asarray(
        flax_peer.make_greedy_decoder(TINY, params)(
            params, data["inputs"], data["inputs_segment_ids"]
        )
    )
    expected = np.zeros_like(tokens)
    for t in range(TINY["target_len"]):  # teacher-forced on its own prefix, no cache
        logits = model.apply(
            {"params": params},
            data["inputs"],
            expected,
            data["inputs_segment_ids"],
            np.ones_like(expected),
            train=False,
        )
        expected[:, t] = np.argmax(logits[:, t], axis=-1)
    np.testing.assert_array_equal(tokens, expected)
    assert len(np.unique(tokens)) > 2


def _perturbed_peer(shape: dict, data: dict):
    model = flax_peer.build_model(shape)
    params = flax_peer.init_params(model, data)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    return model, jax.tree.unflatten(  # away from the init, where every row predicts one token
        tree, [x + jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    )


@pytest.mark.slow  # 3-5 s; benchmark plumbing, not the library
def test_flax_peer_beam_search_is_exact_when_the_beams_hold_every_prefix():
    """Vocabulary 4, 3 tokens, 16 beams = every 2-token prefix: the last step scores all 64
    sequences, so the beams must be the 16 best of a brute-force enumeration, scored by the
    teacher-forced model without a cache, and 1 beam must be greedy decoding."""
    shape = dict(TINY, vocab_size=4, target_len=3)
    data = workload.random_batch(shape["batch"], shape)
    model, params = _perturbed_peer(shape, data)
    src, seg = data["inputs"], data["inputs_segment_ids"]
    tokens, scores = flax_peer.make_beam_decoder(shape, params, 16)(params, src, seg)
    every = np.array(list(itertools.product(range(4), repeat=3)), np.int32)  # [64, 3]
    for row in range(shape["batch"]):
        targets = every
        logits = model.apply(
            {"params": params},
            np.repeat(src[row : row + 1], len(every), 0),
            targets,
            np.repeat(seg[row : row + 1], len(every), 0),
            np.ones_like(targets),
            train=False,
        )
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        totals = np.take_along_axis(np.asarray(log_probs), targets[..., None], -1).sum((1, 2))
        best = np.argsort(-totals)[:16]
        np.testing.assert_allclose(scores[row], totals[best], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(tokens[row], every[best])  # all 16, best first
    greedy = flax_peer.make_greedy_decoder(shape, params)(params, src, seg)
    one_beam, _ = flax_peer.make_beam_decoder(shape, params, 1)(params, src, seg)
    np.testing.assert_array_equal(one_beam[:, 0], greedy)


@pytest.mark.slow
def test_benches_with_the_flax_peer_report_ratios_per_pair():
    out = train.bench_train(2, TINY["batch"], "float32", peer="flax", shape=TINY)
    peer = out["peer"]
    assert peer["name"] == "flax" and peer["num_params"] == out["num_params"]
    assert len(peer["ratio_per_pair"]) == 2 and peer["compile_seconds"] > 0
    assert "attention probabilities" in peer["dropout"]
    decoded = decode.bench_decode(2, TINY["batch"], "float32", shape=TINY, peer="flax")
    assert len(decoded["peer"]["greedy_cached_ratio_per_pair"]) == 2
    assert decoded["peer"]["greedy_cached"]["generated_tokens_per_second"]["median"] > 0
    assert len(decoded["peer"]["beam4_ratio_per_pair"]) == 2
    assert decoded["peer"]["beam4"]["generated_tokens_per_second"]["median"] > 0


def test_time_pairs_alternates_order():
    calls = []
    first, times, peer_times = timing.time_pairs(
        lambda: calls.append("tfjax"), lambda: calls.append("peer"), repeats=3
    )
    # Warm-up of each, then pairs: tfjax first in even pairs, the peer first in odd ones.
    assert calls == ["tfjax", "peer", "tfjax", "peer", "peer", "tfjax", "tfjax", "peer"]
    assert first >= 0 and len(times) == len(peer_times) == 3


def _dot_flops(jaxpr) -> int:
    """2 * (batch * free * contracted sizes) summed over every dot_general, sub-jaxprs too."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape  # batch and free axes of both operands
            contracted = math.prod(lhs[i] for i in lhs_contract)
            total += 2 * math.prod(out) * contracted
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += _dot_flops(sub)
    return total


@pytest.mark.parametrize("shape", [TINY, dict(TINY, source_len=12, num_layers=2, mlp_dim=24)])
def test_train_flops_formula_counts_the_model_matmuls(shape):
    # Independent count: every dot_general of the forward pass's jaxpr, times 3 (fwd + bwd).
    model = workload.create_model("float32", shape)
    data = workload.random_batch(shape["batch"], shape)
    inputs, targets = jax.numpy.asarray(data["inputs"]), jax.numpy.asarray(data["targets"])
    params = model.init(jax.random.key(0), inputs, targets)
    jaxpr = jax.make_jaxpr(model.apply)(params, inputs, targets)
    counted = 3 * _dot_flops(jaxpr.jaxpr)
    assert mfu.train_flops(shape["batch"], shape) == counted


def test_large_shape_is_the_accelerator_benchmark_of_the_issue():
    large = workload.SHAPES["large"]
    assert (large["embed_dim"], large["batch"], large["source_len"], large["target_len"]) == (
        1024,
        64,
        256,
        256,
    )
    models.ModelConfig(**workload.model_fields(large))  # a valid model config


@pytest.mark.parametrize(
    "kind, dtype, want",
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4e12),
        ("NVIDIA H100 PCIe", "bfloat16", 756e12),
        ("NVIDIA H200", "bfloat16", 989.4e12),
        ("TPU v5 lite", "bfloat16", 197e12),
        ("TPU v5p", "bfloat16", 459e12),
        ("NVIDIA H100 80GB HBM3", "float32", None),
        ("cpu", "bfloat16", None),
    ],
)
def test_datasheet_peak_lookup(kind, dtype, want):
    assert mfu.datasheet_peak(kind, dtype) == want


def test_ceiling_size_by_platform():
    assert mfu.ceiling_size("cpu") == 2048 and mfu.ceiling_size("gpu") == 8192


def test_peer_device_follows_jax():
    assert train.peer_device("gpu") == "cuda" and train.peer_device("cpu") == "cpu"


def test_torch_peer_rejects_unknown_dtype_and_device():
    pytest.importorskip("torch", reason="the torch peer needs the 'parity' extra")
    with pytest.raises(ValueError, match="float32"):
        torch_peer.check_device("cpu", "int8")
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        torch_peer.check_device("mps", "float32")


def test_torch_peer_bf16_autocast_step_runs(one_torch_thread):
    step = torch_peer.make_train_step(TINY, workload.random_batch(2, TINY), dtype="bfloat16")
    assert math.isfinite(step())


def test_time_pairs_warms_each_side_up():
    calls = []
    timing.time_pairs(lambda: calls.append("t"), lambda: calls.append("p"), repeats=2, warmup=3)
    assert calls[:6] == ["t", "t", "t", "p", "p", "p"] and len(calls) == 10


@pytest.mark.slow  # four train-step compilations: about a minute of CPU
def test_depth_bench_reports_compile_time_and_memory_per_configuration():
    shape = dict(depth.DEPTH_SHAPE, vocab_size=32, embed_dim=8, mlp_dim=16, batch=2, target_len=8)
    shape["num_heads"] = 2
    result = depth.bench_depth(1, None, "float32", depths=(1, 2), policies=("full",), shape=shape)
    rows = result["rows"]
    assert [(r["num_layers"], r["scan_layers"], r["remat"]) for r in rows] == [
        (1, False, "full"),
        (1, True, "full"),
        (2, False, "full"),
        (2, True, "full"),
    ]
    for row in rows:
        assert row["compile_seconds"] > 0 and row["compile_cpu_seconds"] > 0
        assert 0 < row["temp_bytes"] < row["peak_bytes"]
        assert row["argument_bytes"] < row["peak_bytes"]
        assert 0 < row["step_seconds_min"] <= row["step_seconds_median"] <= row["step_seconds_max"]
    assert result["shape"]["batch"] == 2 and len(result["load_average"]) == 3
    table = depth.markdown_table(result).splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| 1 | no | full |")


def test_peak_rss_reads_vm_hwm_in_bytes_and_falls_back_without_proc(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9999 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 99 kB\n")
    assert environment.peak_rss_bytes(status) == 1234 * 1024
    assert environment.peak_rss_bytes(tmp_path / "absent") > 10 * 2**20  # ru_maxrss, in bytes


@pytest.mark.slow  # 3-5 s; benchmark plumbing, not the library
def test_a_child_process_reports_its_own_peak_rss_not_its_parents():
    # ru_maxrss would give the child this process's peak (vfork + exec carries it over), and
    # alone()'s two sides would then read the same number whenever the parent is larger.
    held = np.ones(2**30 // 8)  # 1 GiB, touched
    code = "from experiments.bench import environment; print(environment.peak_rss_bytes())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = int(done.stdout.strip().splitlines()[-1])
    assert environment.peak_rss_bytes() > 2**30 > 2 * child, (child, held.size)


def test_rss_alone_refuses_an_unknown_side():
    with pytest.raises(ValueError, match="side must be one of"):
        rss.alone("torch", batch=2, tune_malloc=False)


@pytest.mark.slow
@pytest.mark.parametrize("side", rss.SIDES)
@pytest.mark.parametrize("tune", [True, False])
def test_rss_child_trains_its_side_alone_with_the_parents_allocator(side, tune):
    command = [sys.executable, "-m", "experiments.bench.rss", side, "2", "1", str(int(tune))]
    done = subprocess.run([*command, "float32"], capture_output=True, text=True, check=True)
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["side"] == side
    assert line["host"].endswith(", tuned" if tune else ", default")
    assert 100 * 2**20 < line["peak_rss_bytes"] < 16 * 2**30  # bytes, not KiB or pages
    phases = line["phases"]
    assert phases["built"] <= phases["compiled"] <= phases["trained"] == line["peak_rss_bytes"]
    assert 0 < line["lower_seconds"] < 120 and 0 < line["compile_seconds"] < 120


def test_alone_runs_alternate_the_sides_and_report_every_process(monkeypatch):
    calls = []

    def fake_alone(side, *, batch, tune_malloc, dtype):
        calls.append(side)
        n = len(
            calls
        )  # literal figures: process n peaks at n GiB, lowers in n/10 s, compiles in n s
        return {"peak_rss_bytes": n * 2**30, "lower_seconds": n / 10, "compile_seconds": float(n)}

    monkeypatch.setattr(rss, "alone", fake_alone)
    out = train.alone_runs(batch=2, tune_malloc=True, dtype="float32", runs=3)
    assert calls == ["tfjax", "flax", "flax", "tfjax", "tfjax", "flax"]
    assert out["tfjax"]["peak_rss_bytes"] == [2**30, 4 * 2**30, 5 * 2**30]
    assert out["flax"]["peak_rss_median"] == 3 * 2**30
    assert out["tfjax"]["lower_compile_seconds"] == pytest.approx([1.1, 4.4, 5.5])
    assert out["flax"]["lower_compile_median"] == pytest.approx(3.3)
    assert out["compile_ratio"] == pytest.approx(3.3 / 4.4)


def test_modes_split_bimodal_timings_at_the_largest_jump():
    # 5,500 tokens/s steps with two at ~1,800 (the torch-peer symptom), literal seconds:
    times = [0.372, 0.380, 1.14, 0.375, 0.371, 1.10, 0.377]
    found = timing.modes(times)
    assert found["slow"]["calls"] == [2, 5] and found["fast"]["count"] == 5
    assert found["slow"]["median_seconds"] == pytest.approx((1.14 + 1.10) / 2)
    assert found["fast"]["median_seconds"] == pytest.approx(0.375)
    assert found["gap"] == pytest.approx(1.10 / 0.380)
    assert timing.rates(2048, times)["modes"] == found


@pytest.mark.parametrize("times", [[0.372, 0.380, 0.41, 0.375], [0.5], [0.3, 0.44]])
def test_modes_is_none_for_one_group(times):
    # within 1.5x of each other (0.44 / 0.3 = 1.47), or a single call
    assert timing.modes(times) is None


def test_residual_bench_times_both_implementations_of_the_same_step():
    out = residual.bench_residual(2, TINY["batch"], "float32", shape=TINY)
    rows, width = TINY["batch"] * TINY["target_len"], TINY["embed_dim"]
    assert (out["rows"], out["width"], out["dropout_rate"]) == (rows, width, TINY["dropout_rate"])
    assert out["pallas_minimum_bytes"] == 8 * rows * width * 4
    assert len(out["speedup_per_pair"]) == 2
    for side in ("pallas_seconds", "xla_seconds"):
        assert 0 < out[side]["min"] <= out[side]["median"] <= out[side]["max"]


@pytest.mark.slow  # 3-5 s; benchmark plumbing, not the library
def test_train_bench_builds_the_model_with_the_fused_residual():
    data = workload.random_batch(TINY["batch"], TINY)
    model = workload.create_model("float32", TINY, residual_impl="pallas")
    assert model.config.residual_impl == "pallas"
    run, _ = workload.make_train_step(data, "float32", TINY, residual_impl="pallas")
    assert np.isfinite(float(run()["loss_sum"]))


@pytest.mark.slow
def test_positions_option_hands_the_model_positions_0_to_n(monkeypatch):
    seen = []
    real = workload.make_train_step

    def spy(data, *args, **kwargs):
        seen.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(workload, "make_train_step", spy)
    dense = train.bench_train(1, TINY["batch"], "float32", shape=TINY, positions=True)
    default = train.bench_train(1, TINY["batch"], "float32", shape=TINY)
    assert dense["masks"].startswith("dense") and default["masks"].startswith("by the model")
    for field in ("inputs", "targets"):
        length = TINY["source_len" if field == "inputs" else "target_len"]
        want = np.tile(np.arange(length, dtype=np.int32), (TINY["batch"], 1))
        np.testing.assert_array_equal(seen[0][f"{field}_positions"], want)
        assert f"{field}_positions" not in seen[1]
    # The default positions: the same step either way.
    data = workload.random_batch(TINY["batch"], TINY)
    losses = [
        float(workload.make_train_step(d, "float32", TINY)[0]()["loss_sum"])
        for d in (data, workload.with_positions(data))
    ]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


@pytest.mark.slow
def test_parallel_bench_times_both_modes_of_a_recipe_on_the_same_batch():
    from experiments.bench import parallel

    out = parallel.bench_parallel(2, 16, "float32", spec="configs/base.py:tiny")
    assert out["devices"] == jax.local_device_count() and out["shape"]["global_batch_size"] == 16
    for mode in parallel.MODES:
        rates = out[mode]["target_tokens_per_second"]
        assert 0 < rates["min"] <= rates["median"] <= rates["max"]
        assert out[mode]["compile_seconds"] > 0
    ratio = out["sharded"]["step_seconds_median"] / out["pmap"]["step_seconds_median"]
    assert out["sharded_over_pmap"] == pytest.approx(ratio)
