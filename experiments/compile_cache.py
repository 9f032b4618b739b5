"""What the entry points do when JAX's persistent compilation cache goes wrong.

`experiments.cli` turns the cache on (`cli.use_compilation_cache`), which calls `watch`, and
calls `record` when the command ends. In between:

  * JAX's own warnings about a cache it cannot read or write (`Error writing persistent
    compilation cache entry for 'jit_step': PermissionError: ...`, a Python `UserWarning` per
    program, with its source line) become one `warning:` line per kind (read, write) naming the
    folder and what to do; the command goes on, compiling what it cannot read.
  * Entries swapped in place are not run. JAX keys an entry by its file name and reads whatever
    the file holds: an entry renamed over another one runs the other program, which fails with
    an error from deep inside JAX (a `ValueError`, an `AssertionError`, XLA's
    `RuntimeProgramInputMismatch`) or, when the shapes agree, computes something else. So the
    folder keeps `ENTRIES_FILE`, the size and modification time of every entry as written;
    `watch` removes each entry that no longer has them and whose inode changed after its last
    write (its change time is later: renamed over another, touched, or copied onto with its
    times kept, `cp -p`), with one warning, and JAX compiles those programs again. An entry
    written afresh (change time equal to its write time) is taken as it is: JAX's own write,
    but also a plain `cp` onto an entry, which rewrites the file the same way and cannot be
    told from it.
An entry changed before any tfjax command recorded it cannot be told apart (JAX records nothing).
"""

import dataclasses
import json
import logging
import os
import pathlib
import re
import warnings

from tfjax.training import storage

log = logging.getLogger(__name__)

ENTRIES_FILE = "tfjax-entries.json"  # {entry file name: [size, modification time in ns]}
_SUFFIX = "-cache"  # JAX's entry files: `<module>-<key>-cache`

# JAX's warnings (jax/_src/compiler.py) for an entry it could not read or write.
_CACHE_WARNING = re.compile(
    r"Error (?P<verb>reading|writing) persistent compilation cache entry for '[^']*': "
    r"(?P<cause>.*)",
    re.DOTALL,
)


@dataclasses.dataclass
class _Watch:
    directory: pathlib.Path | None = None  # the folder `watch` was last called with
    said: set[str] = dataclasses.field(default_factory=set)  # the kinds of warning logged
    hooked: bool = False


_STATE = _Watch()


def watch(directory: str | os.PathLike | None) -> None:
    """Removes the entries of `directory` changed since they were written (one warning) and
    turns JAX's warnings about the cache into `warning:` lines (hooked once per process);
    None: the cache is off, nothing to watch or record."""
    _STATE.directory = None if directory is None else pathlib.Path(directory)
    if _STATE.directory is None:
        return
    if not _STATE.hooked:
        warnings.showwarning = _show_warning(warnings.showwarning)
        _STATE.hooked = True
    removed = _sync(_STATE.directory, remove=True)
    if removed:
        log.warning(
            "the compilation cache %s: removed %d entries renamed or changed since they were "
            "written (%s%s); their programs compile again",
            directory,
            len(removed),
            min(removed),
            ", ..." if len(removed) > 1 else "",
        )


def record() -> None:
    """Records the entries written since `watch` (call when the command ends)."""
    if _STATE.directory is not None:
        _sync(_STATE.directory, remove=False)


def _sync(directory: pathlib.Path, *, remove: bool) -> list[str]:
    """Brings `ENTRIES_FILE` up to date with the entries in `directory`; with `remove`, deletes
    (and returns the names of) entries changed since they were recorded. Does nothing where the
    folder cannot be read or written (JAX's warnings say so)."""
    try:
        recorded = _read_entries(directory / ENTRIES_FILE)
        current, changed = {}, []
        for path in directory.glob(f"*{_SUFFIX}"):
            stat = path.stat()
            written = [stat.st_size, stat.st_mtime_ns]
            if recorded.get(path.name, written) != written and stat.st_ctime_ns > stat.st_mtime_ns:
                changed.append(path.name)  # renamed or touched since written: not JAX's write
                if remove:
                    path.unlink()
                else:
                    current[path.name] = recorded[path.name]  # for the next `watch`
                continue
            current[path.name] = written
        if current != recorded:
            _write_entries(directory / ENTRIES_FILE, current)
    except OSError:
        return []
    return changed if remove else []


def _read_entries(path: pathlib.Path) -> dict[str, list[int]]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError:  # damaged: start the record again
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_entries(path: pathlib.Path, entries: dict[str, list[int]]) -> None:
    """Writes the record atomically (commands sharing the folder may race: the last one's
    record wins, and an entry missing from it is recorded again when next seen)."""
    storage.write_text_atomic(path, json.dumps(entries, sort_keys=True))


def _show_warning(show):
    """`warnings.showwarning` with JAX's cache warnings logged as one line per kind."""

    def shown(message, category, filename, lineno, file=None, line=None):
        match = _CACHE_WARNING.match(str(message))
        if match is None:
            return show(message, category, filename, lineno, file, line)
        verb = match["verb"]
        if verb not in _STATE.said:
            _STATE.said.add(verb)
            log.warning(
                "the compilation cache %s cannot be %s (%s): programs are %s; give "
                "--compilation_cache_dir a folder this user can write, or --nocompilation_cache",
                _STATE.directory,
                "read" if verb == "reading" else "written",
                " ".join(match["cause"].split()),
                "compiled again" if verb == "reading" else "compiled, but not kept",
            )
        return None

    return shown
