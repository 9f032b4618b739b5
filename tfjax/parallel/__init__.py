"""Where the step runs: data parallelism with pmap, jit on a device mesh, multi-process jobs.

`strategies` wraps one train step for `parallel.mode=pmap` or `sharded`; nothing else in
tfjax knows which mode runs. `distributed` joins a multi-process job and holds what its
processes agree on. Imports nothing else from tfjax.
"""

from tfjax import _lazy

__all__ = ["distributed", "strategies"]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
