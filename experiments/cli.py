"""What every entry point shares: the absl start-up, quiet library logs, one-line user errors.

`main(entry)` runs an entry point as `absl.app.run` does, and sorts what goes wrong:
  * a user error prints `error: <message>` on one line on stderr and exits with status 2: a
    `tfjax.errors.UserError`, a missing or misplaced file or directory (`FileNotFoundError`,
    `FileExistsError`, `NotADirectoryError`, `IsADirectoryError`, `PermissionError`), a write
    that met a full or read-only disk (`tfjax.training.storage.storage_problem`), a flag absl
    rejects;
  * Ctrl-C prints `interrupted` and exits with status 130;
  * anything else is a bug: Python's traceback, status 1 (`--debug` shows it for the others too).
A process of a multi-process job whose peer died (`DistributedError` with `exit_at_once`) ends
right after its one line, skipping the interpreter's shutdown, where JAX would wait for the dead
peer. Where libtpu is installed but no TPU is attached, every entry point computes on the CPU
without waking libtpu (`tfjax.training.host.cpu_unless_tpu`).

Console output is plain lines (`HH:MM:SS message`, `warning: ...`, `error: ...`), written
through tqdm when it is loaded so that a live progress bar is redrawn below them; absl's full
format stays for `--verbose`, `--logtostderr` and `--log_dir` (docs/training.md, "Console
output"). Every entry point but the benchmark and the planner (which measure compilation) keeps
its compiled programs in JAX's persistent compilation cache (`--compilation_cache_dir`,
`--nocompilation_cache`; docs/compilation_cache.md); JAX's warnings about a cache it cannot
read or write become one `warning:` line, and entries renamed or swapped in place are removed
before JAX reads them (`experiments.compile_cache`).
"""

import functools
import logging
import os
import pathlib
import re
import sys
import traceback
from collections.abc import Callable, Sequence

from absl import app, flags
from absl import logging as absl_logging

from experiments import compile_cache
from tfjax import errors

USAGE_STATUS = 2  # the shell's convention for "wrong usage", as argparse uses it
INTERRUPTED_STATUS = 130  # 128 + SIGINT
USER_ERRORS = (
    errors.UserError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    flags.Error,
)

# absl's message for a flag marked required and not given.
_REQUIRED = re.compile(r"Flag --(\w+) must have a value other than None")


class UsageError(errors.UserError):
    """A command line the tool cannot run (unexpected arguments, a bad flag combination).

    Not `absl.app.UsageError`: absl answers that one with the whole module docstring.
    """


def main(
    entry: Callable,
    *,
    config_overrides: bool = False,
    compilation_cache: bool = True,
    argv: Sequence[str] | None = None,
):
    """Runs `entry(argv)` under absl, with one-line user errors; never returns.

    Args:
        entry: the entry point's main; takes the argv absl leaves (program name first), and
            with `config_overrides` also `overrides=["a.b=value", ...]`.
        config_overrides: take `--config.a.b=value` flags out of argv first
            (`experiments.config_utils.split_config_overrides`) and pass them on.
        compilation_cache: offer `--compilation_cache[_dir]` and use the persistent
            compilation cache (see the module docstring); False for tools that time compilation.
        argv: the command line, program name first (default `sys.argv`).
    """
    argv = list(sys.argv if argv is None else argv)
    _cpu_unless_tpu()
    sys.unraisablehook = _ignore_closed_event_loop(sys.unraisablehook)
    if "debug" not in flags.FLAGS:
        flags.DEFINE_bool("debug", False, "Show the traceback of user errors too.")
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool(
            "verbose",
            False,
            "Log in absl's full format (level, date, time, thread, file:line) and let the "
            "libraries log at INFO too.",
        )
    if compilation_cache:
        _define_cache_flags()
        entry = _with_compilation_cache(entry)
    entry = _with_console_logs(entry)
    try:
        if config_overrides:
            from experiments import config_utils

            argv, overrides = config_utils.split_config_overrides(argv)
            entry = functools.partial(entry, overrides=overrides)
        app.run(entry, argv=argv, flags_parser=_parse_flags)
    except (Exception, KeyboardInterrupt) as error:
        status = report(error, debug=_debug(argv))
        if getattr(error, "exit_at_once", False):  # a peer process died: JAX's shutdown
            sys.stdout.flush()  # would wait for it past the launcher's grace period
            sys.stderr.flush()
            os._exit(status)
        sys.exit(status)


def _with_console_logs(entry: Callable) -> Callable:
    """`entry`, with the console's log format set by the parsed flags before it runs."""

    @functools.wraps(entry)
    def run(argv, **kwargs):
        options = flags.FLAGS
        log_file = options["log_dir"].present and bool(options.log_dir)
        if log_file:
            pathlib.Path(options.log_dir).mkdir(parents=True, exist_ok=True)
            if options.verbose:
                options.alsologtostderr = True  # absl's own "file and stderr"
            absl_logging.get_absl_handler().use_absl_log_file()  # absl's format, in log_dir
        plain = not (options.verbose or options.logtostderr or options.alsologtostderr)
        console_logs(plain=plain, keep_absl=log_file)
        return entry(argv, **kwargs)

    return run


class ConsoleFormatter(logging.Formatter):
    """A record as one plain console line: `HH:MM:SS message` (INFO and below, local time),
    `warning: message`, `error: message` (ERROR and above); a traceback follows if any."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return f"{self.formatTime(record, '%H:%M:%S')} {text}"


class ConsoleHandler(logging.Handler):
    """Writes `ConsoleFormatter` lines to the current `sys.stderr`.

    Looks `sys.stderr` up at each record (tests and notebooks swap it). Once tqdm is imported
    (a `Progress` bar may be live) lines go through `tqdm.write`, which clears the bar, writes
    the line and draws the bar again below it.
    """

    def __init__(self):
        super().__init__()
        self.setFormatter(ConsoleFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line, stream = self.format(record), sys.stderr
            bars = sys.modules.get("tqdm")
            if bars is not None and hasattr(bars, "tqdm"):
                bars.tqdm.write(line, file=stream)
            else:
                stream.write(line + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def console_logs(*, plain: bool = True, keep_absl: bool = False) -> None:
    """Sets how the root logger's records reach the console (called once flags are parsed).

    Args:
        plain: a `ConsoleHandler` on stderr; False: absl's handler alone (full format).
        keep_absl: keep absl's handler beside the plain one (it writes the `--log_dir` file);
            otherwise it leaves the root logger, or every line would show twice.
    Calling it again replaces what an earlier call set.
    """
    root, absl_handler = logging.getLogger(), absl_logging.get_absl_handler()
    for handler in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(handler)
    if plain and not keep_absl:
        root.removeHandler(absl_handler)
    elif absl_handler not in root.handlers:
        root.addHandler(absl_handler)
    if plain:
        root.addHandler(ConsoleHandler())


def _cpu_unless_tpu() -> None:
    """JAX_PLATFORMS=cpu where libtpu is installed on a host without TPUs
    (`tfjax.training.host.cpu_unless_tpu`): no libtpu start-up errors, and the CPU
    allocator tuning of `experiments.train` applies; child processes (`experiments.sweep`'s
    runs, `experiments.launch_local`'s processes) inherit it."""
    from tfjax.training import host

    if host.cpu_unless_tpu() and "jax" in sys.modules:  # imported early: tell it too
        import jax

        jax.config.update("jax_platforms", "cpu")


def _define_cache_flags() -> None:
    if "compilation_cache" in flags.FLAGS:
        return
    flags.DEFINE_bool(
        "compilation_cache",
        True,
        "Keep compiled XLA programs on disk and reuse them in later runs "
        "(--nocompilation_cache: compile everything again).",
    )
    flags.DEFINE_string(
        "compilation_cache_dir",
        None,
        "Folder of the compilation cache (default: $JAX_COMPILATION_CACHE_DIR, else "
        "$XDG_CACHE_HOME/tfjax/jax, else ~/.cache/tfjax/jax).",
    )


def _with_compilation_cache(entry: Callable) -> Callable:
    """`entry`, turning the compilation cache on or off (by the flags) before it runs."""

    @functools.wraps(entry)
    def run(argv, **kwargs):
        options = flags.FLAGS
        if options.compilation_cache:
            use_compilation_cache(options.compilation_cache_dir or default_cache_dir())
        else:
            use_compilation_cache(None)
        try:
            return entry(argv, **kwargs)
        finally:
            compile_cache.record()  # the entries this command wrote, as they are now

    return run


def default_cache_dir() -> pathlib.Path:
    """$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/tfjax/jax, else ~/.cache/tfjax/jax."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "tfjax" / "jax"


def use_compilation_cache(directory: str | os.PathLike | None) -> None:
    """Points JAX's persistent compilation cache at `directory` (None: turns it off).

    Every program is kept, however fast it compiled (JAX's default skips those under a second:
    in a tiny run that is most of its compile time, hundreds of small programs); the threshold
    can still be set with $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS. Sets process-wide JAX
    configuration; does not start any computation (the allocator tuning may still follow).
    """
    import jax

    compile_cache.watch(directory)  # JAX's warnings as one line; swapped entries removed
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    threshold = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)


def _ignore_closed_event_loop(hook: Callable) -> Callable:
    """Wraps `sys.unraisablehook` to drop orbax's leftovers from a failed restore.

    When one array of a checkpoint cannot be read, orbax gives up and closes its event loop
    while tensorstore still finishes the other reads; their callbacks then fail with
    "RuntimeError: Event loop is closed", which Python prints as a bare traceback after our
    one-line error. Nothing is lost with them; any other unraisable error still reaches `hook`.
    """
    if getattr(hook, "ignores_closed_event_loop", False):
        return hook

    def filtered(unraisable) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        hook(unraisable)

    filtered.ignores_closed_event_loop = True
    return filtered


def _parse_flags(argv: list[str]) -> list[str]:
    return flags.FLAGS(argv)  # a flags.Error goes to `main`, not to absl's usage text


def _debug(argv: Sequence[str]) -> bool:
    """Whether argv turns --debug on (read from argv: flags may not be parsed yet)."""
    on = False
    for arg in argv:
        if arg == "--":
            break
        if arg in ("--debug", "-debug") or arg.startswith(("--debug=", "-debug=")):
            on = arg.partition("=")[2].lower() in ("", "true", "1")
        elif arg in ("--nodebug", "-nodebug"):
            on = False
    return on


def report(error: BaseException, *, debug: bool = False) -> int:
    """Prints what the user needs to see about `error`; returns the exit status.

    A user error (see the module docstring) is one line `error: <message>` and status 2;
    Ctrl-C is `interrupted` and status 130; anything else the traceback and status 1. With
    `debug`, the traceback comes first in every case.
    """
    user = isinstance(error, USER_ERRORS)
    interrupted = isinstance(error, KeyboardInterrupt)
    if not (user or interrupted):
        storage_error = _storage_error(error)
        user, error = storage_error is not None, storage_error or error
    if debug or not (user or interrupted):
        traceback.print_exception(error)
    if interrupted:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    if not user:
        return 1
    print(f"error: {message(error)}", file=sys.stderr, flush=True)
    return USAGE_STATUS


def _storage_error(error: BaseException) -> errors.StorageError | None:
    """A write anywhere (metrics, config.json, an output file) that met a full or read-only
    disk, as one line naming the file and its filesystem; None for any other error."""
    from tfjax.training import storage

    problem = storage.storage_problem(error)
    if problem is None:
        return None
    path = getattr(error, "filename", None) or os.getcwd()
    if problem == storage.READ_ONLY:
        return storage.read_only_error(path, str(path))
    return storage.full_disk_error(path, f"writing {path}")


def message(error: BaseException) -> str:
    """The error's text on one line, with the hint a bare OS or flag error lacks."""
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        text = f"{error.filename}: {error.strerror}"  # e.g. raised by open() or mkdir()
    else:
        text = str(error) or type(error).__name__
    restoring = sys.modules.get("tfjax.training.checkpointing.restoring")  # loaded if it raised
    if restoring is not None and isinstance(error, restoring.VerificationError):
        text += _compilation_cache_fix()
    if isinstance(error, flags.Error):
        required = _REQUIRED.search(text)
        if required and required.group(1) in flags.FLAGS:
            name = required.group(1)
            what = flags.FLAGS[name].help.split(";")[0].rstrip(".")  # absl appends "; repeat..."
            text = f"missing --{name}: {what}"
        text += " (--helpshort lists the flags)"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _compilation_cache_fix() -> str:
    """How to get compiled programs made afresh: the cache this command uses, if any."""
    import jax

    directory = jax.config.jax_compilation_cache_dir
    if not (jax.config.jax_enable_compilation_cache and directory):
        return ""
    return f"; rerun with --nocompilation_cache, or delete the compilation cache {directory}"


def quiet_logs() -> None:
    """Keeps orbax (which logs every file it reads or writes at INFO) quiet, tfjax at INFO;
    with `--verbose` every library logs at INFO."""
    options = flags.FLAGS
    verbose = "verbose" in options and options.is_parsed() and options.verbose
    absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.WARNING)
    # absl sets the root logger's level only while its handler is the root's; not on a console
    logging.getLogger().setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("tfjax").setLevel(logging.INFO)


def no_arguments(argv: Sequence[str]) -> None:
    """Refuses positional arguments (absl leaves them in argv after the program name)."""
    if len(argv) > 1:
        raise UsageError(
            f"unexpected arguments {' '.join(argv[1:])}: flags take the form --name=value "
            "(--helpshort lists them)"
        )


def print_lines(lines: list[str], warnings: list[str]) -> None:
    """Warnings on stderr, then one output line per input on stdout."""
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
