"""What a compiled step costs per device: memory, collectives, FLOPs, bytes, a roofline time.

Everything here reads a program compiled with `jax.jit(...).lower(...).compile()` (for any
devices, attached or not: `tfjax.parallel.topology`). Numbers are per device, as XLA reports
them for an SPMD-partitioned program.
  * `memory`: `compiled.memory_analysis()`; the peak estimate is arguments + outputs - aliased
    (donated) + temporaries + generated code, XLA's buffer assignment for one step.
  * `collectives`: the cross-device operations in the optimised HLO text, counted statically
    (an op inside a loop counts once) with the bytes of their results.
  * `roofline`: time = max(FLOPs / peak FLOP/s, bytes accessed / memory bandwidth) from
    `compiled.cost_analysis()` (Williams, Waterman & Patterson 2009, "Roofline: an insightful
    visual performance model for multicore architectures"). It ignores collectives, overlap and
    kernel efficiency: a bound, not a prediction. The cost analysis counts a `while` loop's
    body once (`loops`), so programs with loops are undercounted.
"""

import collections
import dataclasses
import math
import re
from typing import Any

import jax

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# `%name = TYPE op(` or `%name = TYPE op-start(`; TYPE is one shape or a tuple of shapes (whose
# text may hold `/*index=5*/` comments and TPU layouts such as `{1,0:T(8,128)}`).
_LHS = r"^\s*(?:ROOT\s+)?%[\w.-]+\s*=\s*(?P<type>\(.*?\)|\S+)\s+"
_OP = re.compile(_LHS + r"(?P<op>" + "|".join(COLLECTIVES) + r")(?P<part>-start|-done)?\(")
# A computation's first line: `%name (params) -> type {` (or `ENTRY %name ...`).
_COMPUTATION = re.compile(r"^(ENTRY )?%(?P<name>[\w.-]+) .*\{$")
_FUSED_REDUCE_SCATTER = re.compile(_LHS + r"fusion\(.*calls=%all-reduce-scatter[\w.-]*")
_WHILE = re.compile(_LHS + r"while\(")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,]*)\]")
_BITS = re.compile(r"(\d+)")


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per device of one compiled step (`compiled.memory_analysis()`)."""

    arguments: int
    outputs: int
    aliased: int  # outputs that reuse donated argument buffers
    temporaries: int
    code: int

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code


def memory(compiled: Any) -> Memory:
    """The `Memory` of a `jax.stages.Compiled`."""
    stats = compiled.memory_analysis()
    return Memory(
        arguments=int(stats.argument_size_in_bytes),
        outputs=int(stats.output_size_in_bytes),
        aliased=int(stats.alias_size_in_bytes),
        temporaries=int(stats.temp_size_in_bytes),
        code=int(stats.generated_code_size_in_bytes),
    )


def shape_bytes(hlo_type: str) -> int:
    """Bytes of every array in an HLO type such as `(f32[8,128]{1,0}, bf16[4])`; pred = 1."""
    total = 0
    for match in _SHAPE.finditer(hlo_type):
        bits = _BITS.search(match["dtype"])
        itemsize = max(1, int(bits.group(1)) // 8) if bits else 1
        dims = [int(d) for d in match["dims"].split(",") if d]
        total += itemsize * math.prod(dims)
    return total


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{op: {"count": n, "bytes": result bytes}} of the collectives in optimised HLO text.

    An asynchronous pair (`all-gather-start` / `all-gather-done`) counts once, with the bytes
    of the `-done` result. The TPU compiler writes a reduce-scatter as a fusion that calls a
    computation named `all-reduce-scatter*` (an all-reduce and a per-device slice): it counts
    as one reduce-scatter, and the all-reduce inside it not at all.
    """
    found: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"count": 0, "bytes": 0})
    computation = ""
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header["name"]
            continue
        fused = _FUSED_REDUCE_SCATTER.search(line)
        if fused:
            found["reduce-scatter"]["count"] += 1
            found["reduce-scatter"]["bytes"] += shape_bytes(fused["type"])
            continue
        match = _OP.search(line)
        if not match or computation.startswith("all-reduce-scatter"):
            continue
        entry = found[match["op"]]
        if match["part"] != "-done":
            entry["count"] += 1
        if match["part"] != "-start":
            entry["bytes"] += shape_bytes(match["type"])
    return {op: dict(found[op]) for op in COLLECTIVES if op in found}


def loops(hlo_text: str) -> int:
    """How many `while` loops the optimised HLO has. XLA's cost analysis counts a loop's body
    once, so FLOPs and bytes inside loops (e.g. the TPU compiler's windowed collective matmuls
    under FSDP) are undercounted by their trip counts."""
    return sum(1 for line in hlo_text.splitlines() if _WHILE.search(line))


def cost(compiled: Any) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per device of one step, from `compiled.cost_analysis()`."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per program
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def roofline(
    flops: float, bytes_accessed: float, peak_flops: float, bandwidth: float
) -> dict[str, Any]:
    """Seconds of one step at the device's peak compute or memory bandwidth, whichever binds."""
    compute, memory_time = flops / peak_flops, bytes_accessed / bandwidth
    return {
        "compute_s": compute,
        "memory_s": memory_time,
        "step_s": max(compute, memory_time),
        "bound": "compute" if compute >= memory_time else "memory",
    }


def sharded_bytes(tree: Any, shardings: Any) -> int:
    """Bytes one device holds of `tree` (arrays or `ShapeDtypeStruct`s) laid out by
    `shardings` (a matching tree of `jax.sharding.Sharding`): each leaf's shard shape."""
    leaves = jax.tree.leaves(tree)
    placed = jax.tree.leaves(shardings)
    return sum(
        math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize
        for x, s in zip(leaves, placed, strict=True)
    )
