"""The bench's profile summary (`experiments.bench.profile`) and the train bench's --dropout /
--trace_dir options."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import cli
from experiments.bench import profile, suite, train

# A made-up trace: one GPU with a compute stream and the derived "XLA Ops" line (which repeats
# the stream's kernels and must not be counted twice), and a host thread that is not a kernel.
_TRACE = [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
    {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
    {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
    {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name", "args": {"name": "__main__.py"}},
    # stream kernels (microseconds): [0, 100) gemm, [100, 130) fusion, [120, 150) reduce
    # (overlapping the fusion by 10), gap, [200, 260) cudnn attention, [260, 300) gemm
    {"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": 100, "name": "nvjet_sm90_tst_NNT"},
    {"ph": "X", "pid": 1, "tid": 7, "ts": 100, "dur": 30, "name": "loop_add_fusion_3"},
    {"ph": "X", "pid": 1, "tid": 7, "ts": 120, "dur": 30, "name": "input_reduce_fusion_12"},
    {"ph": "X", "pid": 1, "tid": 7, "ts": 200, "dur": 60, "name": "cudnn_sdpa_fprop"},
    {"ph": "X", "pid": 1, "tid": 7, "ts": 260, "dur": 40, "name": "nvjet_sm90_tst_NNT"},
    {"ph": "X", "pid": 1, "tid": 9, "ts": 0, "dur": 300, "name": "fusion.1"},
    {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 999, "name": "$main.py:1 step"},
]


def test_summarize_counts_stream_kernels_once_per_step():
    s = profile.summarize(_TRACE, steps=2)
    assert s["kernels_per_step"] == 5 / 2
    assert s["span_ms"] == pytest.approx(300 / 2 / 1000)
    # busy: [0, 150) and [200, 300) = 250 us; the 10 us overlap is counted once
    assert s["busy_ms"] == pytest.approx(250 / 2 / 1000)
    assert s["gaps_ms"] == pytest.approx(50 / 2 / 1000)
    assert s["kernel_ms"] == pytest.approx(260 / 2 / 1000)
    assert s["by_category_ms"] == pytest.approx(
        {"matmul": 0.07, "attention": 0.03, "reduction": 0.015, "elementwise": 0.015}
    )
    top = s["top"][0]
    assert (top["name"], top["calls"], top["category"]) == ("nvjet_sm90_tst_NNT", 1.0, "matmul")
    assert top["ms"] == pytest.approx(0.07)


def test_summarize_falls_back_to_the_xla_ops_line_and_to_cpu_operations():
    tpu_like = [e for e in _TRACE if e.get("tid") != 7]
    s = profile.summarize(tpu_like, steps=1)
    assert (s["kernels_per_step"], s["span_ms"]) == (1, pytest.approx(0.3))
    cpu = [
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 5, "tid": 2, "name": "thread_name", "args": {"name": "tf_XLAEigen/1"}},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 0, "dur": 8, "name": "dot.4"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 0, "dur": 10, "name": "ThunkExecutor::Execute"},
        # the pool's markers and waits, not operations (a wait lies inside its operation)
        {"ph": "X", "pid": 5, "tid": 2, "ts": 1, "dur": 0, "name": "ThreadpoolListener::Record"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 6, "dur": 2, "name": "SlinkyThreadPool::Await"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 8, "dur": 1, "name": "end: dot.4"},
    ]
    s = profile.summarize(cpu, steps=1)
    assert s["kernels_per_step"] == 1 and s["by_category_ms"] == {"matmul": 0.008}
    assert s["span_ms"] == pytest.approx(0.008)
    with pytest.raises(ValueError, match="no device kernels"):
        profile.summarize(cpu[:2], steps=1)
    with pytest.raises(ValueError, match="steps=0"):
        profile.summarize(_TRACE, steps=0)


@pytest.mark.parametrize(
    "name, want",
    [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", "attention"),
        ("gemm_fusion_dot_general_204", "matmul"),
        ("ynn_fusion", "matmul"),  # XLA:CPU's dot fusions run by YNNPACK
        ("input_add_reduce_fusion_2", "reduction"),
        ("loop_slice_fusion", "copy"),
        ("loop_add_compare_fusion_1", "elementwise"),
        ("wrapped_broadcast", "other"),
    ],
)
def test_kernel_categories(name, want):
    assert profile.category(name) == want


def test_profile_command_says_what_is_missing(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench.profile", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no perfetto_trace.json.gz under")
    assert "--trace_dir" in proc.stderr and "Traceback" not in proc.stderr


_TINY = dict(
    vocab_size=64,
    embed_dim=32,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    mlp_dim=64,
    dropout_rate=0.1,
    batch=2,
    source_len=8,
    target_len=8,
)


def test_train_bench_traces_steps_that_the_summary_reads(tmp_path):
    out = train.bench_train(
        repeats=1, batch=2, dtype="float32", shape=_TINY, trace_dir=str(tmp_path)
    )
    assert out["trace_dir"] == str(tmp_path) and out["dropout_rate"] == 0.1
    assert out["optimizer"] == "adam per array"
    summary = profile.main([str(tmp_path), f"--steps={train.TRACED_STEPS}"])
    assert summary == 0
    events = json.load(__import__("gzip").open(profile.find_trace(str(tmp_path))))
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert profile.summarize(events, train.TRACED_STEPS)["kernels_per_step"] > 10


@pytest.mark.slow  # tfjax's side alone, in the default tier: the test above
def test_train_bench_with_the_flax_peer_traces_both_sides(tmp_path):
    out = train.bench_train(
        repeats=1, batch=2, dtype="float32", shape=_TINY, peer="flax", trace_dir=str(tmp_path)
    )
    assert out["peer"]["name"] == "flax"
    names = {}
    for side in ("tfjax", "flax"):
        events = json.load(__import__("gzip").open(profile.find_trace(str(tmp_path / side))))
        events = events["traceEvents"] if isinstance(events, dict) else events
        summary = profile.summarize(events, train.TRACED_STEPS)
        assert summary["busy_by_category_ms"]["matmul"] > 0
        # the union of the matmuls' intervals is at most their summed time (equal, to rounding,
        # when none overlap)
        busy, summed = summary["busy_by_category_ms"]["matmul"], summary["by_category_ms"]["matmul"]
        assert busy <= summed + 1e-6  # ms: 1 ns of rounding
        names[side] = {e["name"] for e in profile.kernel_events(events) if "fusion" in e["name"]}
    assert names["tfjax"] != names["flax"]  # each trace holds its own side's program


@pytest.mark.slow
def test_flattened_adam_makes_the_same_update():
    """optax.flatten ravels the parameters for Adam; the step must not change the numbers."""
    from experiments.bench import workload

    data = workload.random_batch(2, _TINY)
    per_array, _ = workload.make_train_step(data, "float32", _TINY)
    flat, _ = workload.make_train_step(data, "float32", _TINY, flatten_optimizer=True)
    for _ in range(3):
        a, b = jax.device_get(per_array()), jax.device_get(flat())
    np.testing.assert_allclose(a["loss_sum"], b["loss_sum"], rtol=1e-5)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)


@pytest.mark.parametrize(
    "bench, option, match",
    [("train", {"dropout": 1.0}, r"--dropout=1\.0"), ("decode", {"cache_start": -1}, "=-1")],
)
def test_suite_rejects_a_dropout_rate_outside_0_1_and_a_negative_cache_start(bench, option, match):
    with pytest.raises(cli.UsageError, match=match):
        next(
            suite.run(
                [bench],
                shape_name="base",
                batch=2,
                dtype="float32",
                repeats=1,
                warmup=1,
                **option,
            )
        )
