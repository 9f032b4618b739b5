"""Peak host memory (RSS) of one side's training process alone, for `--peer=flax`.

Timed in one process, the two sides share one peak RSS (the train line's `peak_rss_bytes`). To
compare the memory each would need alone, `alone` starts a fresh Python process per
side that builds that side's train step at the benchmark shape, runs `steps` steps and reports
its own peak RSS (`environment.peak_rss_bytes`: VmHWM, the high-water mark of the child's
own address space, which includes the interpreter, JAX and the compiled program; not
ru_maxrss, which a child started by vfork + exec inherits from this process), and
the peak so far at three points (`phases`): the state built, the step compiled ahead of time
(`lower().compile()`, XLA's compile-time memory), and the steps run; and the seconds that
lowering and compiling took (a compile time measured in a process of its own, the same way
for both sides, where the train line's `compile_seconds` is a first call's excess over a
step, after the other side compiled in the same process). The
child inherits the environment (`JAX_PLATFORMS`, XLA flags) and gets the parent's allocator
state: glibc malloc is tuned in the child exactly when it is in the parent.

    python -m experiments.bench.rss tfjax 32 3 1 float32   # side, batch, steps, tune (1/0), dtype
"""

import json
import subprocess
import sys
import time

SIDES = ("tfjax", "flax")


def alone(
    side: str, *, batch: int, steps: int = 3, tune_malloc: bool, dtype: str = "float32"
) -> dict:
    """The line of a fresh process training `side` on `batch` rows for `steps` steps.

    Returns its JSON line: `peak_rss_bytes`, `phases` (peak RSS so far after building,
    compiling and training), `lower_seconds` and `compile_seconds` (the step traced and
    lowered, then compiled by XLA, ahead of time: the child's first compilation of it).

    Raises:
        ValueError: for an unknown side.
        RuntimeError: if the child fails (its stderr's last line is in the message).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    flags = [str(batch), str(steps), str(int(tune_malloc)), dtype]
    command = [sys.executable, "-m", "experiments.bench.rss", side, *flags]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the {side} memory child failed (exit {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(side: str, batch: int, steps: int, tune_malloc: bool, dtype: str) -> None:
    from tfjax.training import host

    if tune_malloc:
        host.tune_glibc_malloc()
    import jax

    from experiments.bench import environment, flax_peer, workload

    shape = workload.SHAPE
    data = workload.random_batch(batch, shape)
    if side == "tfjax":
        run, _ = workload.make_train_step(data, dtype, shape)
    else:
        run = flax_peer.make_train_step(shape, data, dtype=dtype)
    phases = {"built": environment.peak_rss_bytes()}
    start = time.perf_counter()
    lowered = run.lower()
    lowered_at = time.perf_counter()
    lowered.compile()  # the program the first call compiles: XLA's compile-time memory
    seconds = {
        "lower_seconds": lowered_at - start,
        "compile_seconds": time.perf_counter() - lowered_at,
    }
    phases["compiled"] = environment.peak_rss_bytes()
    for _ in range(steps):
        jax.block_until_ready(run())
    phases["trained"] = rss = environment.peak_rss_bytes()
    line = {"side": side, "peak_rss_bytes": rss, "phases": phases, **seconds}
    print(json.dumps({**line, "host": host.malloc_description()}))


if __name__ == "__main__":
    _side, _batch, _steps, _tune, _dtype = sys.argv[1:]
    _child(_side, int(_batch), int(_steps), _tune == "1", _dtype)
