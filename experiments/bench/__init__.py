"""The benchmark harness: `python -m experiments.bench --help` (the command line is `__main__`).

Every sub-benchmark prints one JSON line: the shape, its rates (median, min, max over repeats
after a warm-up), compile time, peak resident memory of the process, the device allocator's peak
(`device_peak_bytes`, GPU and TPU), and the jax/flax versions and device. Modules:

- `workload`: the shapes (`--shape=base`, `large`), the random batch, the tfjax model and its
  jitted train step.
- `timing`: timers (warm-up, repeats, alternating pairs with a peer) and rate statistics.
- `mfu`: model FLOPs per train step, the measured matmul ceiling, the datasheet peaks.
- `environment`: versions, device, allocator and peak-memory readings.
- `train`, `decode`, `attention`, `depth` (compile time and memory by depth, scan and remat),
  `sweep` (trials one by one against one vectorised program), `residual` (the fused post-LN
  kernel against XLA): the sub-benchmarks; `suite` runs them by name.
- `rss`: one side's peak host memory in a process of its own (the train line's `alone`).
- `profile`: where a traced step's time goes (`python -m experiments.bench.profile DIR`).
- `torch_peer`, `flax_peer`: the peers, `torch.nn.Transformer` and Flax's stock layers set up
  like the tfjax model, for `--peer=torch` and `--peer=flax`.

What each measures and what retired investigations found: docs/performance.md.

Importing the package (or any module but `__main__`) defines no flags and runs nothing.
"""
