"""Lazy submodule access for the package `__init__` files: `import tfjax` stays cheap."""

import importlib
from collections.abc import Callable, Sequence


def submodules(package: str, names: Sequence[str]) -> tuple[Callable, Callable]:
    """(`__getattr__`, `__dir__`) for `package` that import `package.<name>` on first access."""

    def __getattr__(name: str):
        if name in names:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(names)

    return __getattr__, __dir__
