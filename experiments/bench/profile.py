"""Where a traced train step's time goes: `python -m experiments.bench.profile DIR [--steps=3]`.

Reads the Perfetto trace that `jax.profiler.trace(DIR, create_perfetto_trace=True)` wrote (the
bench's `--trace_dir`) and prints, per step: the span from the first kernel's start to the last
kernel's end, the time some kernel was running (the union of the kernels' intervals) and the
gaps (span - busy), the kernel time by category (matmul, attention, reduction, copy,
elementwise), summed and as wall time (the union of the category's intervals: kernels of one
category may run side by side, on a CPU on the XLA thread pool's threads) and the kernels
that took longest, with their counts.

Kernels are the complete ("X") events on the device's stream lines (a process named
"/device:GPU:N" or "/device:TPU:N": its "Stream ..." threads, else its "XLA Ops" line); on a
CPU trace, the XLA thread pool's operations ("tf_XLAEigen" threads, without the pool's own
markers and waits) stand in for them. Names ending in ".N" or "_N" are grouped (`fusion_12`
and `fusion_7` are two kernels of one kind only when the compiler numbered them so; the
grouping is of names, not of computations).
"""

import collections
import glob
import gzip
import json
import os
import re
import sys

# Category of a kernel, from the first pattern its (lower-case) name matches.
CATEGORIES = (
    ("attention", re.compile(r"cudnn|fmha|flash|attention")),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|cublas|matmul|\bdot|convolution|ynn")),
    ("reduction", re.compile(r"reduc|softmax|norm")),
    ("copy", re.compile(r"copy|transpose|memcpy|memset|concatenate|slice|gather|scatter")),
    ("elementwise", re.compile(r"fusion|loop_|elementwise|convert|add|multiply")),
)
_NUMBER_SUFFIX = re.compile(r"([._]\d+)+$")
# Events on XLA:CPU's threads that are not operations: the executor around them, the thread
# pool's region markers (zero length), the completion marks of asynchronous operations, and a
# thread's waits for the pool inside an operation (whose own event covers them).
_CPU_MARKERS = ("ThunkExecutor", "ThreadpoolListener::", "end: ", "SlinkyThreadPool::")


def category(name: str) -> str:
    """The `CATEGORIES` entry whose pattern `name` matches first, else "other"."""
    low = name.lower()
    for label, pattern in CATEGORIES:
        if pattern.search(low):
            return label
    return "other"


def find_trace(trace_dir: str) -> str:
    """The newest perfetto_trace.json.gz under `trace_dir`; FileNotFoundError names the fix."""
    found = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not found:
        raise FileNotFoundError(
            f"no perfetto_trace.json.gz under {trace_dir}: trace with "
            "jax.profiler.trace(dir, create_perfetto_trace=True) (the bench's --trace_dir)"
        )
    return max(found, key=os.path.getmtime)


def kernel_events(events: list[dict]) -> list[dict]:
    """The kernels of a trace's events (see the module docstring)."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }

    def on_line(e: dict, prefix: str, process: str = "/device:") -> bool:
        return processes.get(e["pid"], "").startswith(process) and threads.get(
            (e["pid"], e.get("tid")), ""
        ).startswith(prefix)

    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    for prefix, process in (("Stream", "/device:"), ("XLA Ops", "/device:")):
        found = [e for e in complete if on_line(e, prefix, process)]
        if found:  # a GPU's streams; a TPU's op line (on a GPU it repeats the streams' kernels)
            return found
    return [
        e
        for e in complete
        if on_line(e, "tf_XLAEigen", "/host:") and not e["name"].startswith(_CPU_MARKERS)
    ]


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(events: list[dict], steps: int, top: int = 25) -> dict:
    """Per-step milliseconds of a trace's kernels (times in the trace are microseconds)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: at least 1")
    kernels = kernel_events(events)
    if not kernels:
        raise ValueError("the trace holds no device kernels and no XLA CPU operations")
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    span = max(b for _, b in intervals) - min(a for a, _ in intervals)
    busy = _busy(intervals)
    by_category: dict[str, float] = collections.defaultdict(float)
    category_intervals: dict[str, list] = collections.defaultdict(list)
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        label = category(e["name"])
        by_category[label] += e["dur"]
        category_intervals[label].append((e["ts"], e["ts"] + e["dur"]))
        group = by_name[_NUMBER_SUFFIX.sub("", e["name"])]
        group[0] += e["dur"]
        group[1] += 1
    ms = 1e-3 / steps
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps,
        "kernels_per_step": len(kernels) / steps,
        "span_ms": span * ms,
        "busy_ms": busy * ms,
        "gaps_ms": (span - busy) * ms,
        "kernel_ms": sum(e["dur"] for e in kernels) * ms,
        "by_category_ms": {k: v * ms for k, v in sorted(by_category.items(), key=lambda x: -x[1])},
        "busy_by_category_ms": {
            k: _busy(category_intervals[k]) * ms
            for k in sorted(by_category, key=lambda k: -by_category[k])
        },
        "top": [
            {"name": name, "ms": total * ms, "calls": count / steps, "category": category(name)}
            for name, (total, count) in ranked
        ],
    }


def format_summary(s: dict) -> str:
    lines = [
        f"per step ({s['steps']} traced): span {s['span_ms']:.2f} ms, kernels busy "
        f"{s['busy_ms']:.2f} ms, gaps {s['gaps_ms']:.2f} ms, "
        f"{s['kernels_per_step']:.0f} kernels ({s['kernel_ms']:.2f} ms summed)",
        "by category: " + ", ".join(f"{k} {v:.2f} ms" for k, v in s["by_category_ms"].items()),
        "wall time some kernel of the category ran: "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in s["busy_by_category_ms"].items()),
    ]
    for row in s["top"]:
        lines.append(
            f"  {row['ms']:8.3f} ms  {row['calls']:6.1f} calls  {row['category']:<11} {row['name']}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    options = [a for a in argv if a.startswith("--")]
    steps = options[0].removeprefix("--steps=") if len(options) == 1 else "3"
    if len(args) != 1 or len(options) > 1 or not steps.isdigit():
        print("usage: python -m experiments.bench.profile TRACE_DIR [--steps=3]", file=sys.stderr)
        return 2
    try:
        path = find_trace(args[0])
        with gzip.open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        summary = summarize(events, int(steps))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
