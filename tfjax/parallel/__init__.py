"""Where the step runs: data parallelism with pmap, jit on a device mesh, multi-process jobs.

`strategies` wraps one train step for `parallel.mode=pmap` or `sharded`; nothing else in
tfjax knows which mode runs. `layout` lays arrays out on the mesh by logical axis names.
`distributed` joins a multi-process job and holds what its processes agree on; `rendezvous`
is the check-in of an explicit job's processes before JAX starts. `topology`
gives devices to compile for (TPU slices, simulated CPUs) and `costs` what a compiled step
costs. Imports nothing else from tfjax.
"""

from tfjax import _lazy

__all__ = ["costs", "distributed", "layout", "rendezvous", "strategies", "topology"]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
