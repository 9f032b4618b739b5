"""The train bench under several settings in one go, each in a fresh process, with a table.

    python -m experiments.bench.variants --out=DIR [--budget=520] [--only=a,b,combined] [--list]
        [--base_args="--bench=train --shape=large ..."]

Made for a short lease of an accelerator (issue 22's GPU part): each variant is one
`python -m experiments.bench --bench=train ...` process (XLA flags are read once per process,
so each variant needs its own), its JSON line appended to DIR/results.jsonl as soon as it
ends and its log to DIR/log.txt. The baseline runs first and again later (`base_again`, with
a profiler trace in DIR/trace), so the table shows the run-to-run spread beside each change.
After `base_again`, `combined` runs every option variant so far (not the diagnostics) that
beat the slower baseline by more than the baselines' spread, together. Variants are started
only while the time left of `--budget` seconds exceeds `--reserve`, so the command ends
inside its lease. `--autotune_cache=DIR` shares XLA:GPU's autotuning results between the
processes (shorter compiles after the first; the first variant's compile time is the cold one).
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import time

BASE_ARGS = (
    "--bench=train",
    "--shape=large",
    "--dtype=bfloat16",
    "--attention_impl=cudnn",
    "--warmup=3",
    "--repeats=20",
)

# name -> (extra bench flags, extra XLA flags, kind). "option": may join `combined`;
# "diagnostic": changes the workload (dropout, batch), so it only explains where time goes.
VARIANTS = {
    "base": ((), (), "baseline"),
    "command_buffers": (
        (),
        (
            "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN",
            "--xla_gpu_graph_min_graph_size=1",
        ),
        "option",
    ),
    "flat_adam": (("--flatten_optimizer",), (), "option"),
    "cublaslt": ((), ("--xla_gpu_enable_cublaslt=true",), "option"),
    "no_dropout": (("--dropout=0",), (), "diagnostic"),
    "base_again": (("--trace_dir={out}/trace",), (), "baseline"),
    "cudnn_layer_norm": ((), ("--xla_gpu_enable_cudnn_layer_norm=true",), "option"),
    "batch_128": (("--batch=128",), (), "diagnostic"),
    "no_triton_gemm": ((), ("--xla_gpu_enable_triton_gemm=false",), "option"),
    "rbg": (("--prng_impl=rbg",), (), "option"),
    "fused_residual": (("--residual_impl=pallas",), (), "option"),
    "no_triton_gemm_fused": (
        ("--residual_impl=pallas",),
        ("--xla_gpu_enable_triton_gemm=false",),
        "option",
    ),
    # The masks as dense [B, 1, L, S] arrays (explicit positions), as before attention.Lengths:
    # with cuDNN, a bias read and its gradient computed in every attention call.
    "no_triton_gemm_fused_dense": (
        ("--residual_impl=pallas", "--positions"),
        ("--xla_gpu_enable_triton_gemm=false",),
        "diagnostic",
    ),
    "no_triton_gemm_fused_trace": (
        ("--residual_impl=pallas", "--trace_dir={out}/trace"),
        ("--xla_gpu_enable_triton_gemm=false",),
        "diagnostic",
    ),
    "no_triton_gemm_trace": (
        ("--trace_dir={out}/trace",),
        ("--xla_gpu_enable_triton_gemm=false",),
        "diagnostic",
    ),
    "no_triton_cublaslt": (
        (),
        ("--xla_gpu_enable_triton_gemm=false", "--xla_gpu_enable_cublaslt=true"),
        "option",
    ),
    "fusion_autotuner": ((), ("--xla_gpu_experimental_enable_fusion_autotuner=true",), "option"),
}
COMBINED = "combined"
_OPTIONS = {"out", "budget", "reserve", "per_variant", "only", "base_args", "autotune_cache"}


def command(
    name: str, out: str, variants: dict = VARIANTS, base_args: tuple = BASE_ARGS
) -> tuple[list[str], dict]:
    """The bench command line and the environment of variant `name` (plus `combined`)."""
    bench_flags, xla_flags, _ = variants[name]
    argv = [sys.executable, "-m", "experiments.bench", *base_args]
    argv += [f.format(out=out) for f in bench_flags]
    env = dict(os.environ)
    if xla_flags:
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *xla_flags]).strip()
    return argv, env


def share_autotune_cache(path: str) -> bool:
    """Points XLA:GPU's per-fusion autotuning cache at `path` for every variant, if this XLA
    knows the flag (probed in a throwaway process: an unknown XLA flag aborts a process)."""
    flag = f"--xla_gpu_per_fusion_autotune_cache_dir={path}"
    env = dict(os.environ, XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), flag]).strip())
    probe = [sys.executable, "-c", "import jax.numpy as jnp; jnp.ones(1).block_until_ready()"]
    ok = subprocess.run(probe, env=env, capture_output=True).returncode == 0
    if ok:
        os.makedirs(path, exist_ok=True)
        os.environ["XLA_FLAGS"] = env["XLA_FLAGS"]
    print(f"autotune cache {path}: {'shared' if ok else 'flag unknown here, not used'}")
    return ok


def tokens_per_second(result: dict | None) -> float | None:
    return None if result is None else result["target_tokens_per_second"]["median"]


def winners(results: dict, variants: dict = VARIANTS) -> list[str]:
    """Option variants more than 1% faster than the faster of the two baselines."""
    bases = [tokens_per_second(results.get(n)) for n in ("base", "base_again")]
    bases = [b for b in bases if b is not None]
    if not bases:
        return []
    floor = max(bases)
    return [
        name
        for name, (_, _, kind) in variants.items()
        if kind == "option" and (tokens_per_second(results.get(name)) or 0.0) > floor * 1.01
    ]


def combine(names: list[str], variants: dict = VARIANTS) -> tuple:
    bench_flags = tuple(f for n in names for f in variants[n][0])
    xla_flags = tuple(f for n in names for f in variants[n][1])
    return bench_flags, xla_flags, "option"


def row(name: str, result: dict | None, seconds: float) -> str:
    if result is None:
        return f"{name:<18} failed or timed out after {seconds:.0f} s (see log.txt)"
    rate = result["target_tokens_per_second"]
    peak = result.get("mfu_vs_peak")
    device_peak = result.get("device_peak_bytes") or 0
    return (
        f"{name:<18} {rate['median']:>10,.0f} tok/s ({rate['min']:,.0f}-{rate['max']:,.0f})"
        f"  MFU {100 * (peak or 0):5.1f}% of peak, {100 * result['mfu']:5.1f}% of jnp.dot"
        f"  compile {result['compile_seconds']:5.1f} s  peak {device_peak / 2**30:5.1f} GiB"
        f"  [{seconds:.0f} s]"
    )


def main(argv: list[str]) -> int:
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    extra = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")} - _OPTIONS - {"list"}
    if extra:
        print(f"unknown options {sorted(extra)}; known: {sorted(_OPTIONS)}, list", file=sys.stderr)
        return 2
    if "--list" in argv:
        for name, (bench_flags, xla_flags, kind) in VARIANTS.items():
            print(f"{name:<18} {kind:<10} {' '.join(bench_flags + xla_flags)}")
        return 0
    if "out" not in opts:
        print("usage: python -m experiments.bench.variants --out=DIR [--budget=S]", file=sys.stderr)
        return 2
    try:
        budget, reserve = float(opts.get("budget", 520)), float(opts.get("reserve", 75))
        per_variant = float(opts.get("per_variant", 150))
    except ValueError as err:
        print(f"--budget, --reserve and --per_variant take seconds: {err}", file=sys.stderr)
        return 2
    only = opts["only"].split(",") if "only" in opts else None
    unknown = set(only or ()) - set(VARIANTS) - {COMBINED}
    if unknown:
        print(f"unknown variants {sorted(unknown)}; --list names them", file=sys.stderr)
        return 2
    out = opts["out"]
    os.makedirs(out, exist_ok=True)
    base_args = tuple(shlex.split(opts["base_args"])) if "base_args" in opts else BASE_ARGS
    start = time.monotonic()
    variants = dict(VARIANTS)
    results: dict[str, dict | None] = {}
    lines = []
    if only is None:  # `combined` right after the second baseline, before the rest
        queue = list(VARIANTS)
        queue.insert(queue.index("base_again") + 1, COMBINED)
    else:  # in the order given
        queue = list(only)
    if "autotune_cache" in opts:
        share_autotune_cache(opts["autotune_cache"])
    for name in queue:
        if name == COMBINED:
            chosen = winners(results)
            if not chosen:
                lines.append(f"{COMBINED:<18} not run: no option beat the baselines' spread")
                continue
            variants[COMBINED] = combine(chosen)
            lines.append(f"{COMBINED:<18} = {' + '.join(chosen)}")
        left = budget - (time.monotonic() - start)
        if left < reserve:
            lines.append(f"{name:<18} not run: {left:.0f} s left of the budget")
            continue
        argv_i, env = command(name, out, variants, base_args)
        began = time.monotonic()
        with open(os.path.join(out, "log.txt"), "a") as log:
            log.write(f"\n=== {name}: {shlex.join(argv_i)}  XLA_FLAGS={env.get('XLA_FLAGS', '')}\n")
            log.flush()
            try:
                proc = subprocess.run(
                    argv_i,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=min(per_variant, left - 10),
                )
                found = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                result = json.loads(found[-1]) if found else None
                log.write(proc.stdout)
            except subprocess.TimeoutExpired:
                result = None
        seconds = time.monotonic() - began
        results[name] = result
        if result is not None:
            result["variant"] = name
            result["xla_flags"] = env.get("XLA_FLAGS", "")
            with open(os.path.join(out, "results.jsonl"), "a") as f:
                f.write(json.dumps(result) + "\n")
        lines.append(row(name, result, seconds))
        print(lines[-1], flush=True)
    bases = [tokens_per_second(results.get(n)) for n in ("base", "base_again")]
    bases = [b for b in bases if b]
    print("\n".join(["", *lines]))
    if bases:
        print(f"baseline median of medians {statistics.median(bases):,.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
