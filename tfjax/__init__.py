"""tfjax: a functional JAX/Flax research codebase for Transformers.

Importing this package has no side effects: no flag parsing, no device initialisation and no
logging set-up. Submodules are imported lazily on first attribute access so that
`import tfjax` stays fast, while `from tfjax import attention, masking` works as usual.
"""

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "attention",
    "beam_search",
    "checkpointing",
    "data",
    "decoding",
    "evaluation",
    "layers",
    "linear",
    "logger",
    "losses",
    "masking",
    "models",
    "optim",
    "parallel",
    "positional",
    "runtime",
    "trainer",
    "training",
)

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
