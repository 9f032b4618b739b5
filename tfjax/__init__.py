"""tfjax: a functional JAX/Flax research codebase for Transformers.

Importing this package has no side effects: no flag parsing, no device initialisation and no
logging set-up. Subpackages are imported lazily on first attribute access so that
`import tfjax` stays fast, while `from tfjax.nn import attention, masking` works as usual.
"""

from tfjax import _lazy

__version__ = "0.2.0"

# The layers, bottom up (each imports only those before it; `data` and `parallel` nothing):
# nn → models → inference → training → runs, beside data and parallel; `pretrained` (Hugging
# Face checkpoints, read with transformers when installed) sits on models; `viz` (pictures,
# drawn with matplotlib when installed) reads metrics through `training`. `errors` (the family
# of errors a user can fix) imports nothing, so every layer may import it.
_SUBPACKAGES = (
    "data",
    "errors",
    "inference",
    "models",
    "nn",
    "parallel",
    "pretrained",
    "runs",
    "training",
    "viz",
)

__all__ = ["__version__", *_SUBPACKAGES]
__getattr__, _dir = _lazy.submodules(__name__, _SUBPACKAGES)


def __dir__():
    return sorted(__all__)
