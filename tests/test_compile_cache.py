"""The entry points' guard on JAX's compilation cache (`experiments.compile_cache`): JAX's
warnings about a cache it cannot use as one `warning:` line, and entries swapped in place removed
before JAX runs them. Unit tests on files written here; the real JAX cache through a small entry
point in subprocesses."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from experiments import compile_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def state(monkeypatch):
    """A fresh record of what was watched, and `warnings.showwarning` restored afterwards."""
    import warnings

    monkeypatch.setattr(compile_cache, "_STATE", compile_cache._Watch())
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    return compile_cache._STATE


def _entries(folder: pathlib.Path, *names: str) -> None:
    folder.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        (folder / f"{name}-cache").write_bytes(bytes([i]) * (10 + i))


def _swap(folder: pathlib.Path, a: str, b: str) -> None:
    os.rename(folder / f"{a}-cache", folder / "x")
    os.rename(folder / f"{b}-cache", folder / f"{a}-cache")
    os.rename(folder / "x", folder / f"{b}-cache")


def test_entries_swapped_after_they_were_recorded_are_removed(tmp_path, state, caplog):
    cache = tmp_path / "cache"
    _entries(cache, "jit_a-1", "jit_b-2", "jit_c-3")
    compile_cache.watch(cache)  # records what JAX wrote
    recorded = json.loads((cache / compile_cache.ENTRIES_FILE).read_text())
    assert sorted(recorded) == ["jit_a-1-cache", "jit_b-2-cache", "jit_c-3-cache"]
    time.sleep(0.01)
    _swap(cache, "jit_a-1", "jit_b-2")
    with caplog.at_level(logging.WARNING):
        compile_cache.watch(cache)
    assert sorted(p.name for p in cache.glob("*-cache")) == ["jit_c-3-cache"]
    assert "removed 2 entries renamed or changed" in caplog.text and str(cache) in caplog.text
    caplog.clear()
    compile_cache.watch(cache)  # nothing left to remove, nothing said
    assert caplog.text == ""


def test_entries_written_afresh_or_copied_with_their_times_are_kept(tmp_path, state, caplog):
    cache = tmp_path / "cache"
    _entries(cache, "jit_a-1", "jit_b-2")
    compile_cache.watch(cache)
    (cache / "jit_a-1-cache").unlink()
    (cache / "jit_a-1-cache").write_bytes(b"compiled again, another size")  # as JAX writes
    with caplog.at_level(logging.WARNING):
        compile_cache.watch(cache)
        copy = tmp_path / "copy"
        shutil.copytree(cache, copy)  # copy2: times kept, on new files changed since
        compile_cache.watch(copy)
    assert caplog.text == ""
    for folder in (cache, copy):
        assert sorted(p.name for p in folder.glob("*-cache")) == ["jit_a-1-cache", "jit_b-2-cache"]


def test_an_entry_copied_onto_with_its_times_is_removed(tmp_path, state, caplog):
    """`cp -p a b` (shutil.copy2): b's inode changed after the write time it was given. (A
    plain `cp` rewrites b as JAX writes an entry and is kept: docs/compilation_cache.md.)"""
    cache = tmp_path / "cache"
    _entries(cache, "jit_a-1", "jit_b-2")
    compile_cache.watch(cache)
    time.sleep(0.01)
    shutil.copy2(cache / "jit_a-1-cache", cache / "jit_b-2-cache")
    with caplog.at_level(logging.WARNING):
        compile_cache.watch(cache)
    assert "removed 1 entries renamed or changed" in caplog.text
    assert [p.name for p in cache.glob("*-cache")] == ["jit_a-1-cache"]


def test_a_record_that_cannot_be_replaced_leaves_no_temporary_file(tmp_path, state, monkeypatch):
    cache = tmp_path / "cache"
    _entries(cache, "jit_a-1")

    def cannot_replace(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "replace", cannot_replace)
    compile_cache.watch(cache)  # the record is not written; the command goes on
    assert sorted(p.name for p in cache.iterdir()) == ["jit_a-1-cache"]


def test_a_swap_during_a_command_is_caught_by_the_next(tmp_path, state, caplog):
    cache = tmp_path / "cache"
    cache.mkdir()
    compile_cache.watch(cache)  # an empty cache at the start
    _entries(cache, "jit_a-1", "jit_b-2")  # what the command compiled
    compile_cache.record()  # its end
    time.sleep(0.01)
    _swap(cache, "jit_a-1", "jit_b-2")
    compile_cache.record()  # another command ending now records no swapped entry
    with caplog.at_level(logging.WARNING):
        compile_cache.watch(cache)
    assert "removed 2 entries" in caplog.text and not list(cache.glob("*-cache"))


def test_jaxs_cache_warnings_become_one_line_per_kind(state, caplog):
    passed = []
    shown = compile_cache._show_warning(lambda *args: passed.append(str(args[0])))
    state.directory = pathlib.Path("/cache")
    write = "Error writing persistent compilation cache entry for 'jit_{}': PermissionError: no"
    with caplog.at_level(logging.WARNING):
        for name in ("step", "eval_step", "greedy"):
            shown(UserWarning(write.format(name)), UserWarning, "compiler.py", 833)
        read = "Error reading persistent compilation cache entry for 'jit_step': OSError: bad"
        shown(UserWarning(read), UserWarning, "compiler.py", 782)
        shown(UserWarning("something else"), UserWarning, "x.py", 1)
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 2, lines
    assert "compilation cache /cache cannot be written (PermissionError: no)" in lines[0]
    assert "compiled, but not kept" in lines[0] and "--nocompilation_cache" in lines[0]
    assert "cannot be read (OSError: bad): programs are compiled again" in lines[1]
    assert passed == ["something else"]  # any other warning is shown as before


# An entry point with the compilation cache on, as every tfjax command has it.
DEMO = """
import sys
import jax, jax.numpy as jnp
from experiments import cli

def main(argv):
    add = jax.jit(lambda x: x + 1.0)
    pair = jax.jit(lambda x, y: (x * 2.0, y))
    total = jax.jit(lambda x: jnp.sum(x))
    x = jnp.arange(3.0)
    print(add(x).tolist(), pair(x, x[:2])[0].tolist(), float(total(x)))

cli.main(main, argv=["demo", *sys.argv[1:]])
"""
RESULT = "[1.0, 2.0, 3.0] [0.0, 2.0, 4.0] 3.0\n"


def _demo(cache: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", DEMO, f"--compilation_cache_dir={cache}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cache_folder_that_cannot_be_made_is_one_warning_line(tmp_path):
    (tmp_path / "file").write_text("")
    done = _demo(tmp_path / "file" / "cache")
    assert done.returncode == 0 and done.stdout == RESULT, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"warning: the compilation cache {tmp_path / 'file' / 'cache'} ")
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr


@pytest.mark.slow  # two runs of a small entry point: about 8 s
def test_a_cache_whose_entries_were_swapped_compiles_them_again(tmp_path):
    cache = tmp_path / "cache"
    first = _demo(cache)
    assert first.returncode == 0 and first.stdout == RESULT, first.stderr
    names = sorted(p.name for p in cache.glob("*-cache"))
    assert len(names) >= 3
    for name in names:  # every entry renamed to the next one's name
        os.rename(cache / name, cache / f"{name}.tmp")
    for name, other in zip(names, names[1:] + names[:1], strict=True):
        os.rename(cache / f"{name}.tmp", cache / other)
    second = _demo(cache)
    assert second.returncode == 0 and second.stdout == RESULT, second.stderr
    assert second.stderr.startswith(f"warning: the compilation cache {cache}: removed ")
    assert len(second.stderr.splitlines()) == 1, second.stderr
