"""Keep `notebooks/*.ipynb` stored without outputs: `python -m experiments.notebooks --strip`.

The notebooks are committed clean (no outputs, no execution counts) so that their diffs show
code and text only; CI executes them from scratch (`tests/test_notebooks.py`). Without
`--strip` this lists the notebooks that carry outputs and exits with status 1 if any do; with
`--strip` it removes the outputs in place. Arguments name notebooks (default: all of them).
Needs nbformat (the `test` extra: `pip install "tfjax[test]"`).
"""

import pathlib
import sys
from typing import Any

from absl import flags

from experiments import cli
from tfjax import errors

FLAGS = flags.FLAGS
NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
# Cell metadata that an execution adds (nbclient's timings, Jupyter's view state).
_RUN_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")
# The kernel fills the notebook's language_info in (its Python version, ...): only the name stays.
_LANGUAGE = {"name": "python"}


def notebook_paths() -> list[pathlib.Path]:
    """Every notebook of the repository, in name order."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _nbformat() -> Any:
    try:
        import nbformat  # lazy: only this tool and the tests need it
    except ImportError as err:
        raise errors.DependencyError(
            'nbformat is not installed: pip install "tfjax[test]"'
        ) from err
    return nbformat


def leftovers(notebook: Any) -> list[str]:
    """What an execution left in `notebook` (a dict-like nbformat v4 notebook), per cell."""
    language = notebook.get("metadata", {}).get("language_info", _LANGUAGE)
    found = [] if language == _LANGUAGE else ["notebook: metadata.language_info"]
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        kinds = [
            "outputs" if cell.get("outputs") else "",
            "an execution count" if cell.get("execution_count") is not None else "",
            *(f"metadata.{key}" for key in _RUN_METADATA if key in cell.get("metadata", {})),
        ]
        if any(kinds):
            found.append(f"cell {index}: " + ", ".join(k for k in kinds if k))
    return found


def strip(notebook: Any) -> None:
    """Removes outputs, execution counts and run metadata from `notebook`, in place."""
    notebook["metadata"]["language_info"] = dict(_LANGUAGE)
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            for key in _RUN_METADATA:
                cell.get("metadata", {}).pop(key, None)


def main(argv):
    nbformat = _nbformat()
    paths = [pathlib.Path(arg) for arg in argv[1:]] or notebook_paths()
    dirty = []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if not leftovers(notebook):
            continue
        if FLAGS.strip:
            strip(notebook)
            nbformat.write(notebook, path)
            print(f"stripped {path}")
        else:
            dirty.append(path)
            print(f"{path}: " + "; ".join(leftovers(notebook)))
    if dirty:
        print("strip them: python -m experiments.notebooks --strip", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    flags.DEFINE_bool("strip", False, "Remove the outputs in place instead of listing them.")
    cli.main(main)
