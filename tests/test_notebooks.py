"""The notebooks in notebooks/: stored clean with a Colab badge and an install cell (fast), and
executed top to bottom in a Jupyter kernel (slow; CI runs it)."""

import os
import pathlib
import re

import pytest

from experiments import notebooks

nbformat = pytest.importorskip("nbformat")

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATHS = notebooks.notebook_paths()
COLAB = "https://colab.research.google.com/github/{owner}/tfjax/blob/main/notebooks/{name}"
# The owner placeholder of the Colab links and of the install cell's REPO (a fork sets both).
OWNER = "OWNER"
CELL_TIMEOUT_S = 600
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_is_stored_clean_with_badge_and_install_cell(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert not notebooks.leftovers(notebook), "python -m experiments.notebooks --strip"
    badge = COLAB.format(owner=OWNER, name=path.name)
    assert any(badge in c.source for c in notebook.cells if c.cell_type == "markdown"), badge
    first_code = next(c.source for c in notebook.cells if c.cell_type == "code")
    assert f'REPO = "https://github.com/{OWNER}/tfjax"' in first_code
    assert "import tfjax" in first_code and "except ImportError:" in first_code
    assert '%pip install -q "tfjax[viz] @ git+{REPO}"' in first_code
    machine_paths = "|".join(f"/{d}/" for d in ("work", "home", "root"))
    assert not re.search(machine_paths, "".join(c.source for c in notebook.cells))


def test_readme_links_every_notebook():
    assert PATHS, f"no notebooks in {notebooks.NOTEBOOK_DIR}"
    readme = (ROOT / "README.md").read_text()
    for path in PATHS:
        assert COLAB.format(owner=OWNER, name=path.name) in readme, path.name


def test_strip_removes_what_an_execution_leaves():
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("1 + 1")]
    )
    cell = notebook.cells[1]
    cell.execution_count = 3
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"})]
    cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    notebook.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    assert notebooks.leftovers(notebook) == [
        "notebook: metadata.language_info",
        "cell 1: outputs, an execution count, metadata.execution",
    ]
    notebooks.strip(notebook)
    assert not notebooks.leftovers(notebook)
    assert cell.outputs == [] and cell.execution_count is None and not cell.metadata
    assert notebook.metadata["language_info"] == {"name": "python"}
    nbformat.validate(notebook)


def _kernel_env() -> dict[str, str]:
    """The environment of a user's kernel: this checkout's tfjax, one CPU device (conftest.py
    simulates 8 for the other tests, which would make the notebooks' training data parallel)."""
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
    env["XLA_FLAGS"] = flags.strip()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    # A last cell says which tfjax the kernel imported: this checkout's, not an installed one.
    notebook.cells.append(nbformat.v4.new_code_cell("import tfjax\nprint(tfjax.__file__)"))
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's cwd: not the repo
    )
    error = None
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellExecutionError as err:
        error = ANSI_COLOUR.sub("", str(err))  # the cell's source and traceback, uncoloured
    if error:
        pytest.fail(f"{path.name} failed: {error}", pytrace=False)
    imported = notebook.cells[-1].outputs[0].text.strip()
    assert imported.startswith(str(ROOT / "tfjax")), f"the kernel imported {imported}"
    # Every figure reached the notebook as a picture, not as "<Figure size ...>" text.
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    texts = [o.get("data", {}).get("text/plain", "") for o in outputs]
    assert not [t for t in texts if t.startswith("<Figure size")], "a figure was not drawn"
