"""Sphinx configuration: MyST Markdown pages, the notebooks rendered without executing them,
and an API reference generated from the docstrings.

Build: python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import pathlib
import re
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # this checkout's tfjax, installed or not

project = "tfjax"
author = "the tfjax authors"
copyright = "the tfjax authors"

extensions = [
    "myst_nb",  # MyST Markdown pages and .ipynb notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # Google-style Args:/Returns: sections
]

# The notebooks live in notebooks/ at the top of the repository; a copy is rendered here.
# tests/test_notebooks.py executes them, so the site shows them as stored (no outputs).
NOTEBOOKS = DOCS / "notebooks"
NOTEBOOKS.mkdir(exist_ok=True)
for _stale in NOTEBOOKS.glob("*.ipynb"):
    if not (ROOT / "notebooks" / _stale.name).exists():
        _stale.unlink()
for _notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    shutil.copyfile(_notebook, NOTEBOOKS / _notebook.name)
nb_execution_mode = "off"

# .rst first: autosummary writes its generated pages with the first suffix.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
myst_heading_anchors = 4  # [text](page.md#a-heading) links to headings
myst_enable_extensions = ["colon_fence", "dollarmath"]
exclude_patterns = ["_build", "README.md"]

autosummary_generate = True
autosummary_imported_members = False
# Each object is documented once, in the module that defines it (packages re-export through
# __all__, which autodoc would otherwise document a second time).
autodoc_default_options = {"members": True, "ignore-module-all": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields, not a second description of each field
# Optional dependencies imported at module level by a few modules.
autodoc_mock_imports = ["torch"]

html_theme = "furo"
html_title = "tfjax"
html_static_path = ["_static"]
html_css_files = ["tables.css"]  # code in table cells may wrap

# The docstrings are written in a Markdown manner: `x` is code. reST reads single backticks as
# "interpreted text" (italic); turn them into inline literals before autodoc renders them.
# reST's complaints about the layout of docstring prose (an indented continuation line, a
# Markdown list without a blank line before it) are not errors of the docs, so the "docutils"
# warning type is silenced; every other warning (a broken link, a missing page, a module that
# fails to import) still fails the -W build.
suppress_warnings = ["docutils"]
_SINGLE_BACKTICKS = re.compile(r"(?<![`\w:])`([^`\n]+)`(?![`_\w])")


def _markdown_to_rest(app, what, name, obj, options, lines):
    """Single backticks -> inline literals; a blank line before a Markdown list that follows a
    paragraph line directly (reST would read it as part of the paragraph)."""
    out, bullet_indent = [], None
    for line in lines:
        text = line.lstrip()
        indent = len(line) - len(text)
        if text.startswith(("- ", "* ")):
            if out and out[-1].strip() and bullet_indent is None:
                out.append("")
            bullet_indent = indent
        elif not text or (bullet_indent is not None and indent <= bullet_indent):
            bullet_indent = None
        out.append(_SINGLE_BACKTICKS.sub(r"``\1``", line))
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", _markdown_to_rest)
