"""Where the step runs: data parallelism with pmap, jit on a device mesh, multi-host start.

`strategies` wraps one train step for `parallel.mode=pmap` or `sharded`; nothing else in
tfjax knows which mode runs. Imports nothing else from tfjax.
"""

from tfjax import _lazy

__all__ = ["strategies"]
__getattr__, __dir__ = _lazy.submodules(__name__, __all__)
