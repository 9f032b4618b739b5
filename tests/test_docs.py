"""The documentation runs: every ```python block of README.md and docs/*.md is executed, and
every shell line naming `python -m experiments.X` (there and in the header of each config file)
has its flags and config overrides parsed.

Conventions (docs/tests.md): a page's Python blocks run in order in one namespace, in a
temporary working directory; an HTML comment `<!-- docs-test: setup` ... `-->` holds hidden
Python that runs just before the next block; `<!-- docs-test: slow -->` on a page moves its
Python blocks to the slow tier (they train a run).
"""

import ast
import json
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_HELPERS = ("__init__", "common")  # configs/ files that are not recipes
RECIPES = [p for p in sorted((ROOT / "configs").glob("*.py")) if p.stem not in _HELPERS]
FENCE = re.compile(r"^\s*```(\S*)\s*$")  # also indented, inside a list item
SETUP = "<!-- docs-test: setup"
SLOW = "<!-- docs-test: slow -->"


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, first line number) of each fenced block, hidden setup blocks as
    language "setup", in page order."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(SETUP):
            end = next(j for j in range(i, len(lines)) if lines[j].rstrip().endswith("-->"))
            body = [line[len(SETUP) :], *lines[i + 1 : end + 1]]
            body[-1] = body[-1].rstrip()[: -len("-->")]
            out.append(("setup", "\n".join(body).strip() + "\n", i + 1))
            i = end + 1
            continue
        match = FENCE.match(line)
        if match:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            out.append((match.group(1), code + "\n", i + 2))
            i = end
        i += 1
    return out


def _page_id(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _python_pages():
    for path in PAGES:
        text = path.read_text()
        if not any(lang == "python" for lang, _, _ in blocks(text)):
            continue
        marks = [pytest.mark.slow] if SLOW in text else []
        yield pytest.param(path, id=_page_id(path), marks=marks)


@pytest.mark.parametrize("path", list(_python_pages()))
def test_python_blocks_run(path, tmp_path, monkeypatch):
    from tfjax.data import registry

    monkeypatch.chdir(tmp_path)  # relative paths (runs/...) land in a fresh folder
    # A page may register a data source; the tests after it in this process see the built-ins.
    monkeypatch.setattr(
        registry, "_SOURCES", {name: registry.get(name) for name in registry.names()}
    )
    namespace: dict = {"__name__": "__docs__"}
    for lang, code, line in blocks(path.read_text()):
        if lang in ("python", "setup"):
            # Line numbers of the page, so a traceback points into the Markdown file.
            source = "\n" * (line - 1) + code
            exec(compile(source, str(path), "exec"), namespace)


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m experiments.X ...` in the page's shell blocks."""
    found = []
    for lang, code, _ in blocks(text):
        if lang not in ("bash", "sh", "shell"):
            continue
        pending = ""  # a command continues while a quote is open (ssh --command='...')
        for line in code.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                found += _commands_in(pending)
            except ValueError:  # "No closing quotation": read on
                continue
            pending = ""
    return found


def header_commands(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m experiments.X ...` line of a config file's
    docstring (a trailing backslash continues a line)."""
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").replace("\\\n", " ")
    lines = [line.strip() for line in doc.splitlines()]
    shell = [line for line in lines if line.startswith("python -m experiments.")]
    return commands("```bash\n" + "\n".join(shell) + "\n```\n")


def _commands_in(line: str) -> list[tuple[str, list[str]]]:
    found, tokens = [], shlex.split(line, comments=True)
    for i, token in enumerate(tokens):
        if "python -m experiments." in token:  # a quoted command (ssh --command='...')
            found += _commands_in(token)
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1].startswith("experiments."):
            args = []
            for arg in tokens[i + 2 :]:
                if arg in ("|", "&&", ";", "--", "||", ">", "<") or arg == "python":
                    break
                args.append(arg)
            found.append((tokens[i + 1].removeprefix("experiments."), args))
    return found


# Run in a fresh process per entry point (each defines its own absl flags): run the module as
# __main__ with experiments.cli.main replaced, so that its flags are defined and nothing runs;
# parse each argument list with those flags, and build the config its --config and
# --config.a.b=value arguments name.
_CHECK = r"""
import json, pathlib, runpy, sys
from absl import flags
from experiments import cli, config_utils

name, argvs = sys.argv[1], json.loads(sys.argv[2])


class Defined(Exception):
    pass


def define_only(entry, **kwargs):  # stands in for cli.main: the flags exist, nothing runs
    raise Defined


cli.main, sys.argv = define_only, [name]
try:
    runpy.run_module(f"experiments.{name}", run_name="__main__")
except Defined:
    pass
except SystemExit:  # a tool that parses its own argv (its usage line): importing is the check
    print("[]")
    sys.exit(0)
if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "")
cli._define_cache_flags()
problems = []
for argv in argvs:
    flags.FLAGS.unparse_flags()
    try:
        args, overrides = config_utils.split_config_overrides([name, *argv])
        rest = flags.FLAGS(args)
        if len(rest) > 1:
            raise ValueError(f"stray arguments {rest[1:]}")
        spec = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
        if spec and pathlib.Path(spec.split(":")[0]).exists():
            config_utils.load_config(spec, overrides)
    except Exception as error:
        problems.append(f"python -m experiments.{name} {' '.join(argv)}: {error}")
print(json.dumps(problems))
"""


@pytest.mark.slow  # a fresh process per entry point: ~10 s
def test_shell_commands_parse():
    by_module: dict[str, list[list[str]]] = {}
    for path in PAGES:
        for module, args in commands(path.read_text()):
            by_module.setdefault(module, []).append(args)
    for path in RECIPES:
        for module, args in header_commands(path):
            by_module.setdefault(module, []).append(args)
    assert len(by_module) >= 10, sorted(by_module)  # train, evaluate, sweep, plan, ...
    problems = []
    for module, argvs in sorted(by_module.items()):
        out = subprocess.run(
            [sys.executable, "-c", _CHECK, module, json.dumps(argvs)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        problems += json.loads(out.stdout.strip().splitlines()[-1])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_config_headers_give_command_and_expectation(path):
    """Each recipe opens with the command that trains it and what to expect (big_vision's
    manner); `test_shell_commands_parse` checks that the commands parse."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    spec = f"--config=configs/{path.name}"
    trains = [
        args for module, args in header_commands(path) if module in ("train", "convert", "sweep")
    ]
    assert any(arg.startswith(spec) for args in trains for arg in args), (path.name, trains)
    assert re.search(r"^Expected\b", doc, re.MULTILINE), path.name
    assert "Presets" in doc, path.name


def test_blocks_and_commands_are_found():
    text = "a\n<!-- docs-test: setup\nx = 1\n-->\n```python\ny = x\n```\n```bash\n"
    text += "echo hi | python -m experiments.translate --workdir=runs/a  # c\n"
    text += "python -m experiments.launch_local --processes=2 -- \\\n"
    text += "    python -m experiments.train --config=configs/base.py:tiny\n```\n"
    assert [lang for lang, _, _ in blocks(text)] == ["setup", "python", "bash"]
    assert blocks(text)[0][1] == "x = 1\n" and blocks(text)[1][2] == 6
    assert commands(text) == [
        ("translate", ["--workdir=runs/a"]),
        ("launch_local", ["--processes=2"]),
        ("train", ["--config=configs/base.py:tiny"]),
    ]


CELL_LIMIT = 300  # characters; what needs more goes in prose or a list below the table
# GitHub's and MyST's rule: an unescaped pipe splits a cell, inside backticks too.
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the page outside fenced blocks and HTML comments."""
    out, fence, comment = [], False, False
    for n, line in enumerate(text.splitlines(), 1):
        if comment or fence:
            comment = comment and "-->" not in line
            fence = fence and line.strip() != "```"
        elif FENCE.match(line):
            fence = True
        elif line.lstrip().startswith("<!--") and "-->" not in line:
            comment = True
        else:
            out.append((n, line))
    return out


def table_rows(text: str) -> list[list[tuple[int, list[str]]]]:
    """Each Markdown table of the page: its rows as (line number, stripped cells)."""
    tables: list[list[tuple[int, list[str]]]] = []
    previous = -1
    for n, line in prose(text):
        if not line.strip().startswith("|"):
            continue
        cells = [c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|"))]
        if n != previous + 1:
            tables.append([])
        tables[-1].append((n, cells))
        previous = n
    return tables


def anchors(text: str) -> set[str]:
    """The heading anchors MyST (`myst_heading_anchors`) and GitHub give the page's headings."""
    found: set[str] = set()
    for _, line in prose(text):
        match = re.match(r"#{1,6} (.*)", line)
        if match:
            title = re.sub(r"[`*]", "", match.group(1)).strip()
            slug = re.sub(r"[^\w\u4e00-\u9fff\- ]", "", title.lower().replace(" ", "-"))
            unique, i = slug, 1
            while unique in found:
                unique, i = f"{slug}-{i}", i + 1
            found.add(unique)
    return found


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_table_cells_are_short_and_rows_complete(path):
    """No table cell over CELL_LIMIT characters (the generated results tables included), and
    every row has its header's number of cells (an unescaped pipe, even in backticks, would
    split a cell and drop the row's last ones)."""
    problems = []
    for table in table_rows(path.read_text()):
        width = len(table[0][1])
        for n, cells in table:
            if len(cells) != width:
                problems.append(f"line {n}: {len(cells)} cells, the header has {width}")
            problems += [
                f"line {n}: a cell of {len(c)} characters: {c[:60]}..."
                for c in cells
                if len(c) > CELL_LIMIT
            ]
    assert not problems, f"{_page_id(path)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_links_between_pages_resolve(path):
    """Every relative link to a page of the docs names a file that exists and, with #anchor,
    one of its headings (Sphinx checks docs/ too; README.md is outside its build)."""
    problems = []
    for n, line in prose(path.read_text()):
        for target in _LINK.findall(line):
            page, _, anchor = target.partition("#")
            if "://" in target or not (page.endswith(".md") or (not page and anchor)):
                continue
            linked = (path.parent / page).resolve() if page else path
            if not linked.exists():
                problems.append(f"line {n}: {target}: no such page")
            elif anchor and anchor not in anchors(linked.read_text()):
                problems.append(f"line {n}: {target}: no such heading")
    assert not problems, f"{_page_id(path)}:\n" + "\n".join(problems)


def test_table_and_link_checks_catch_what_they_should():
    text = "# A `b` title\n\n## A `b` title\n\n| a | b |\n|---|---|\n| `x|y` | z |\n"
    text += f"| {'w' * (CELL_LIMIT + 1)} | v |\n\n"
    text += "```text\n| not | a | table |\n# nor a title\n```\n"
    text += "<!-- docs-test: setup\n# a comment\n-->\n"
    (rows,) = table_rows(text)
    assert [len(cells) for _, cells in rows] == [2, 2, 3, 2]
    assert rows[3][0] == 8 and max(len(c) for c in rows[3][1]) == CELL_LIMIT + 1
    assert anchors(text) == {"a-b-title", "a-b-title-1"}
    assert "where-the-two-steps-time-goes-and-why-15x-is-out-of-reach" in anchors(
        "### Where the two steps' time goes, and why 1.5x is out of reach\n"
    )
