"""Config overrides, stand-in corpora and a command runner shared by the tests that train whole
runs."""

import hashlib
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The `reverse` task on 64 short examples: a run that trains 2 steps and evaluates in seconds.
REVERSE = (
    "train.num_train_steps=2",
    "data.name=reverse",
    "data.num_train_examples=64",
    "data.num_eval_examples=10",
    "data.task_max_len=6",
    "data.max_source_len=8",
    "data.max_target_len=8",
)


def command(module: str, *args: str, stdin: str | bytes = "") -> subprocess.CompletedProcess:
    """`python -m experiments.<module> args` on one CPU device, as on a user's machine; text
    output unless `stdin` is bytes."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the suite's simulated devices are not what a user has
    return subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=isinstance(stdin, str),
        timeout=600,
    )


def write_corpus(monkeypatch, root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """Writes a stand-in for a named corpus under `root` (`files`: path under the data
    directory -> text) and makes the files' sums the shipped ones while `monkeypatch` (a
    `pytest.MonkeyPatch`) lasts; returns `root`."""
    from tfjax.data import corpora

    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        monkeypatch.setitem(corpora.SHA256, name, hashlib.sha256(text.encode()).hexdigest())
    return root
