"""Package-level checks: a side-effect-free import, the README's Colab snippet, the CI commands."""

import ast
import importlib
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
SETUP_CFG = (ROOT / "setup.cfg").read_text()


def _block_after(marker: str) -> str:
    match = re.search(rf"<!-- ci:{marker} -->\n```\w*\n(.*?)```", README, re.S)
    assert match, f"README has no code block after <!-- ci:{marker} -->"
    return match.group(1)


def test_import_is_lazy_and_has_no_side_effects():
    code = (
        "import sys, logging, time\n"
        "t = time.perf_counter()\n"
        "import tfjax\n"
        "elapsed = time.perf_counter() - t\n"
        "assert 'jax' not in sys.modules, 'import tfjax must not import jax'\n"
        "assert not logging.getLogger().handlers, 'import tfjax must not configure logging'\n"
        "assert 'absl.flags' not in sys.modules\n"
        "from tfjax.nn import attention, masking, positional\n"
        "assert hasattr(tfjax, '__version__') and 'nn' in dir(tfjax)\n"
        "assert tfjax.nn.masking is masking and tfjax.models.ModelConfig\n"
        "print(elapsed)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert float(out.stdout.strip()) < 0.5


def test_readme_colab_snippet_runs():
    namespace: dict = {}
    exec(compile(_block_after("colab"), "README.md:colab", "exec"), namespace)
    assert namespace["logits"].shape == (1, 3, 100)


def test_readme_commands_are_the_ci_commands():
    main = _block_after("main").strip()
    test = _block_after("test").strip()
    assert main.endswith("python -m experiments.train --config=configs/base.py:cpu")
    assert "pip install" in test and "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_command test" in ci


def _children(package_dir: pathlib.Path) -> list[str]:
    """The subpackages and public modules in a package's folder, as Python names."""
    names = [p.name for p in package_dir.iterdir() if (p / "__init__.py").is_file()]
    names += [p.stem for p in package_dir.glob("*.py") if not p.name.startswith("_")]
    return sorted(names)


def _lazy_packages() -> list[pathlib.Path]:
    """tfjax and every package under it whose children load on attribute access (`_lazy`)."""
    inits = sorted((ROOT / "tfjax").rglob("__init__.py"))
    return [p.parent for p in inits if "_lazy.submodules(" in p.read_text()]


def test_every_subpackage_is_an_attribute_of_tfjax():
    import tfjax

    names = _children(ROOT / "tfjax")
    assert {"nn", "pretrained", "runs", "errors"} <= set(names)  # the discovery finds them
    for name in names:
        assert name in dir(tfjax), f"tfjax.{name} is missing from tfjax/__init__.py"
        assert getattr(tfjax, name) is importlib.import_module(f"tfjax.{name}")


def test_every_module_of_a_lazy_package_is_an_attribute_of_it():
    packages = _lazy_packages()
    assert ROOT / "tfjax" in packages and ROOT / "tfjax" / "runs" in packages
    for folder in packages:
        name = ".".join(folder.relative_to(ROOT).parts)
        package = importlib.import_module(name)
        missing = [child for child in _children(folder) if child not in dir(package)]
        assert not missing, f"{name}/__init__.py does not list {missing}"
        absent = set(dir(package)) - set(_children(folder)) - {"__version__"}
        assert not absent, f"{name}/__init__.py lists {sorted(absent)}, which do not exist"
        for child in _children(folder):
            assert getattr(package, child) is importlib.import_module(f"{name}.{child}")


def test_the_map_names_every_layer_and_module():
    """tfjax/README.md's map lists each folder of tfjax/ and each module or subpackage in one
    (the modules of a subpackage such as `nn/attention/` are its own business)."""
    text = (ROOT / "tfjax" / "README.md").read_text()
    tree = text.split("```")[1]  # the map: the first block
    layers = [p for p in sorted((ROOT / "tfjax").iterdir()) if (p / "__init__.py").is_file()]
    names = [*_children(ROOT / "tfjax"), *(c for layer in layers for c in _children(layer))]
    assert {"nn", "errors", "pipeline", "rendezvous", "schedules"} <= set(names)
    missing = [name for name in names if not re.search(rf"\b{name}\b", tree)]
    assert not missing, f"tfjax/README.md's map does not name {missing}"


def _newest_changelog_version() -> str:
    match = re.search(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$", CHANGELOG, re.M)
    assert match, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    return match.group(1)


def test_changelog_citation_and_package_name_one_version():
    import tfjax

    assert _newest_changelog_version() == tfjax.__version__
    citation = (ROOT / "CITATION.cff").read_text()
    fields = dict(re.findall(r"^([a-z-]+): (\S.*)$", citation, re.M))
    assert fields["cff-version"] == "1.2.0"
    assert fields["version"] == tfjax.__version__
    assert fields["title"] == "tfjax" and fields["license"] == "Apache-2.0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", fields["date-released"])
    assert f"## [{tfjax.__version__}] - {fields['date-released']}" in CHANGELOG
    assert {"message", "authors", "abstract"} <= {
        k for k, _ in re.findall(r"^([a-z-]+):(.*)$", citation, re.M)
    }
    assert "version = attr: tfjax.__version__" in SETUP_CFG
    assert "license = Apache-2.0" in SETUP_CFG
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()[:200]


def _name(requirement: str) -> str:
    """A distribution's normalised name (PEP 503): `ml_collections` -> `ml-collections`."""
    return re.sub(r"[-_.]+", "-", requirement).lower()


def _pins() -> dict[str, str]:
    """The versions CI installs: .ci/constraints.txt, and torch from .ci/run's pip line."""
    text = (ROOT / ".ci" / "constraints.txt").read_text()
    pins = {_name(n): v for n, v in re.findall(r"^([\w.-]+)==(\S+)$", text, re.M)}
    pins.update(
        {
            _name(n): v
            for n, v in re.findall(r"\b(torch)==(\S+)", (ROOT / ".ci" / "run").read_text())
        }
    )
    return pins


def test_every_floor_is_the_version_ci_installs():
    floors = re.findall(r"^    ([\w.-]+)(?:\[[\w,]+\])?>=([\w.]+)", SETUP_CFG, re.M)
    assert len(floors) > 30 and "jax" in dict(floors)  # the parse finds them
    pins = _pins()
    # filelock's floor is the oldest release with the calls tfjax makes, not CI's version.
    checked = {_name(n): v for n, v in floors if _name(n) in pins and _name(n) != "filelock"}
    assert {"jax", "flax", "grain", "orbax-checkpoint", "torch", "transformers"} <= set(checked)
    wrong = [f"{n}>={v} (CI installs {pins[n]})" for n, v in checked.items() if v != pins[n]]
    assert not wrong, "setup.cfg floors that CI never installs: " + ", ".join(wrong)


# Which tfjax packages each package may import (the layer picture of tfjax/README.md).
LAYERS = {
    "nn": set(),
    "data": set(),
    "parallel": set(),
    "models": {"nn"},
    "inference": {"nn", "models", "data"},
    "training": {"nn", "models", "data", "parallel"},
    "pretrained": {"nn", "models", "data"},  # Hugging Face checkpoints <-> models
    "runs": {"nn", "models", "data", "parallel", "inference", "training", "pretrained"},
    "viz": {"training"},  # arrays in, figures out; metrics.jsonl through training.logger
}


def _tfjax_imports(path: pathlib.Path) -> set[str]:
    """The tfjax packages a module imports anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfjax"):
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tfjax" and len(parts) > 1:
                    found.add(parts[1])
    return found - {"_lazy", "errors"}  # both import nothing: any layer may use them


def test_imports_only_go_down_the_layers():
    package_dir = ROOT / "tfjax"
    packages = {p.name for p in package_dir.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS), "a new subpackage needs its place in LAYERS and the map"
    shared = ("__init__.py", "_lazy.py", "errors.py")
    loose = [p.name for p in package_dir.glob("*.py") if p.name not in shared]
    assert not loose, f"modules belong in a layer's folder: {loose}"
    upward = []
    for path in sorted(package_dir.rglob("*.py")):
        package = path.relative_to(package_dir).parts[0]
        if package not in LAYERS:
            continue
        for imported in _tfjax_imports(path) - {package}:
            if imported not in LAYERS[package]:
                upward.append(f"{path.relative_to(ROOT)} imports tfjax.{imported}")
    assert not upward, "imports against the layer order: " + "; ".join(upward)


def test_errors_import_nothing_and_keep_their_builtin_bases():
    tree = ast.parse((ROOT / "tfjax" / "errors.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    from tfjax import errors

    for cls, base in [
        (errors.ConfigError, ValueError),  # raised as ValueError before the family existed
        (errors.DataError, ValueError),
        (errors.CheckpointError, ValueError),
        (errors.WorkdirLockedError, errors.WorkdirError),
        (errors.DependencyError, ImportError),
        (errors.DivergedError, FloatingPointError),
        (errors.DistributedError, RuntimeError),
    ]:
        assert issubclass(cls, errors.UserError) and issubclass(cls, base)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def _module_imports(name: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    """The tfjax modules `name` imports anywhere (inside functions too, not under
    `if TYPE_CHECKING:`); `from tfjax.a import b` is the module tfjax.a.b when b is one, else
    tfjax.a. A package's own module is its `__init__.py`."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_cycles_finds_a_lazy_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    paths = {_module_name(p): p for p in (ROOT / "tfjax").rglob("*.py")}
    graph = {name: _module_imports(name, path, set(paths)) for name, path in paths.items()}
    assert "tfjax.runs.build" in graph["tfjax.runs.trainer"]  # imports within a folder count
    assert "tfjax.inference.evaluation" in graph["tfjax.runs.evaluator"]  # ... inside functions
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


# What a module's text must not carry: measurements, dates and history belong in docs/ (the code
# points to the page), and the project's internal notes are never cited.
HISTORY = re.compile(
    r"20\d\d-[01]\d-[0-3]\d"  # a date
    r"|\b(STYLE|DESIGN)\.md\b"  # the project's internal notes
    r"|\bissue[- ]\d+"  # the project's issue numbers
    r"|\bRun [A-H]\b"  # a benchmark run's name
)


def test_code_carries_no_dates_or_run_history():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("tfjax", "experiments", "configs")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "\n".join(found)


def test_history_pattern_catches_what_it_should():
    for text in ("measured 2026-11-27", "see STYLE.md", "(issue 21's target)", "docs, Run E"):
        assert HISTORY.search(text), text
    for text in ("issues #6 and #14 of LRA", "Vaswani et al. 2017", "docs/results.md"):
        assert not HISTORY.search(text), text
