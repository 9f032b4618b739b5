"""Package-level checks: a side-effect-free import, the README's Colab snippet, the CI commands."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


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
        "from tfjax import masking\n"
        "assert hasattr(tfjax, '__version__') and 'attention' in dir(tfjax)\n"
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
