"""Errors at the command line (`experiments/cli.py`): one line, status 2, no traceback.

In-process tests of how `cli.report` sorts errors, then every error a user can cause, run
through the real entry points in subprocesses (slow: a Python start with JAX costs seconds
each): train, translate, generate, evaluate, sweep and bench.
"""

import hashlib
import io
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import types

import pytest
import test_workdir_format
import tiny_runs
from absl import flags
from absl import logging as absl_logging
from tiny_runs import REVERSE

from experiments import cli, config_utils
from tfjax import errors
from tfjax.runs import lock, trainer
from tfjax.training import checkpointing

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config=configs/base.py:tiny", *(f"--config.{o}" for o in REVERSE)]
# absl's prefix: level, date, time, thread id, file:line (`I1128 02:36:34.955592 1396 f.py:3]`).
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")
PLAIN_LINE = re.compile(r"^\d\d:\d\d:\d\d \S")  # the console's INFO line: local time, message


# ---------------------------------------------------------------------------------------------
# cli.report: user errors, bugs, Ctrl-C, --debug


@pytest.mark.parametrize(
    "error, expected",
    [
        (errors.ConfigError("unknown config key 'x'; valid keys: a, b"), "unknown config key"),
        (errors.WorkdirLockedError("in use by (host h, pid 1)\nsecond line"), "pid 1) second"),
        (FileNotFoundError(2, "No such file or directory", "data/x.txt"), "data/x.txt: No such"),
        (IsADirectoryError("config.json is a directory"), "is a directory"),
        (flags.UnrecognizedFlagError("nope"), "--helpshort"),
    ],
)
def test_a_user_error_is_one_line_and_status_2(capsys, error, expected):
    assert cli.report(error) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_bug_shows_its_traceback_and_status_1(capsys):
    try:
        {}["missing"]
    except KeyError as bug:
        assert cli.report(bug) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'missing'" in err and "error: " not in err


def test_debug_shows_the_traceback_of_a_user_error_too(capsys):
    try:
        config_utils.apply_override(config_utils.load_config("configs/base.py:tiny"), "zz=1")
    except errors.ConfigError as error:
        assert cli.report(error, debug=True) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "apply_override" in err
    assert err.strip().splitlines()[-1].startswith("error: unknown config key 'zz'")


def test_ctrl_c_is_one_line_and_status_130(capsys):
    assert cli.report(KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize(
    "argv, debug",
    [
        (["p"], False),
        (["p", "--debug"], True),
        (["p", "--debug=false"], False),
        (["p", "--debug", "--nodebug"], False),
        (["p", "--", "--debug"], False),
    ],
)
def test_debug_is_read_from_argv(argv, debug):
    assert cli._debug(argv) is debug  # flags may not be parsed when the error comes


def test_only_the_closed_event_loop_of_a_failed_restore_is_silenced():
    seen = []
    hook = cli._ignore_closed_event_loop(seen.append)
    assert cli._ignore_closed_event_loop(hook) is hook  # main may run twice in one process

    def unraisable(error):
        return types.SimpleNamespace(exc_value=error, exc_type=type(error), object=None)

    hook(unraisable(RuntimeError("Event loop is closed")))
    assert seen == []
    for error in (RuntimeError("Event loop is closed soon"), ValueError("Event loop is closed")):
        hook(unraisable(error))
    assert [repr(u.exc_value) for u in seen] == [
        "RuntimeError('Event loop is closed soon')",
        "ValueError('Event loop is closed')",
    ]


def test_no_arguments_is_a_user_error():
    cli.no_arguments(["prog"])
    with pytest.raises(cli.UsageError, match="unexpected arguments extra"):
        cli.no_arguments(["prog", "extra"])


# ---------------------------------------------------------------------------------------------
# Every error a user can cause, through the real commands (slow).


def _digest(path: pathlib.Path) -> dict[str, str]:
    """Hash of every file under `path` but the lock (what a refused command must not touch)."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != lock.LOCK_FILE
    }


def _alter_one_array(step_dir: pathlib.Path, name: str) -> None:
    """Rewrites one element of the saved array `name` (dotted, e.g. "params.a.kernel") in place.

    Goes through tensorstore, as orbax wrote it, so the files stay readable and only the
    checksums can tell: a deterministic stand-in for a flipped bit in the array data (where a
    byte lands among orbax's files, data or unused index nodes, varies from save to save).
    """
    import tensorstore as ts

    metadata = json.loads((step_dir / "state" / "_METADATA").read_text())
    kvstore = {"driver": "ocdbt", "base": (step_dir / "state").as_uri() + "/", "path": name + "/"}
    array = ts.open(
        {"driver": "zarr3" if metadata.get("use_zarr3") else "zarr", "kvstore": kvstore},
        open=True,
    ).result()
    values = array.read().result().copy()
    values.flat[0] = -values.flat[0] if values.flat[0] else 1
    array.write(values).result()


def _damage_every_data_file(step_dir: pathlib.Path) -> int:
    """Flips a byte in the middle of each file of orbax's `d/` folders; returns how many."""
    damaged = [p for p in step_dir.glob("state/**/d/*") if p.is_file()]
    for data in damaged:
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    return len(damaged)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """A trained seq2seq workdir, copies with an altered array and with damaged files, a file,
    bad config files."""
    root = tmp_path_factory.mktemp("cli")
    trained = root / "trained"
    trainer.train_and_evaluate(config_utils.load_config("configs/base.py:tiny", REVERSE), trained)
    altered, damaged = root / "altered", root / "damaged"
    shutil.copytree(trained, altered)
    _alter_one_array(altered / "checkpoints" / "2", "params.decoder.layer_0.mlp.wi.kernel")
    shutil.copytree(trained, damaged)
    assert _damage_every_data_file(damaged / "checkpoints" / "2") > 0
    older = root / "older"  # as tfjax 0.2.0 wrote it: no workdir format recorded
    shutil.copytree(trained, older)
    for path in (older / "config.json", *older.glob(f"checkpoints/*/{checkpointing.CONFIG_COPY}")):
        test_workdir_format.write_older(path, json.loads(path.read_text()))
    (root / "file").write_text("not a directory\n")
    (root / "syntax.py").write_text("def get_config(arg=None)\n    return None\n")
    (root / "buggy.py").write_text("def get_config(arg=None):\n    return {}['oops']\n")
    (root / "empty").mkdir()
    (root / "typo.flags").write_text("# a misspelt key\n--config.optim.learnng_rate=3\n")
    return {
        "trained": trained,
        "altered": altered,
        "damaged": damaged,
        "older": older,
        "file": root / "file",
        "syntax": root / "syntax.py",
        "buggy": root / "buggy.py",
        "empty": root / "empty",
        "root": root,
    }


def _run(module: str, args: list[str]) -> subprocess.CompletedProcess:
    return tiny_runs.command(module, *args)


# (id, module, arguments with {placeholders} from `paths`, words the message must hold,
#  whether the error comes before anything is logged: then stderr is exactly that one line).
CASES = [
    ("unknown key", "train", [*TINY, "--config.optim.learnng_rate=3"],
     ["unknown config key", "did you mean 'optim.learning_rate'"], True),
    ("wrong type", "train", [*TINY, "--config.train.num_train_steps=abc"],
     ["cannot parse 'abc' as int", "train.num_train_steps", "write an integer"], True),
    ("bad value", "train", [*TINY, "--config.model.num_heads=3"],
     ["embed_dim=32 must be divisible by num_heads=3"], True),
    ("zero interval", "train", [*TINY, "--config.train.checkpoint_every_steps=0"],
     ["train.checkpoint_every_steps must be an integer >= 1"], True),
    ("unknown optimizer", "train", [*TINY, "--config.optim.optimizer=lino"],
     ["OptimConfig.optimizer", "'lino'", "did you mean 'lion'", "adafactor"], True),
    ("bad optimizer argument", "train",
     [*TINY, "--config.optim.optimizer=lion", "--config.optim.kwargs.b3=0.9"],
     ["optax.lion takes no argument 'b3'", "b1=0.9, b2=0.99"], True),
    ("vocabulary of one", "train", [*TINY, "--config.model.vocab_size=1"],
     ["ModelConfig.vocab_size must be >= 2"], True),
    ("bad preset", "train", ["--config=configs/base.py:huge"],
     ["unknown preset 'huge'", "tiny"], True),
    ("missing config file", "train", ["--config=configs/nope.py"],
     ["configs/nope.py", "not found", "--config=configs/base.py:tiny"], True),
    ("config syntax error", "train", ["--config={syntax}"], ["syntax.py", "line 1"], True),
    ("unknown dataset", "train", [*TINY, "--config.data.name=imagenet"],
     ["unknown data source data.name='imagenet'", "scan"], True),
    ("missing data file", "train",
     [*TINY, "--config.data.name=files", "--config.data.train_path={root}/no.tsv",
      "--config.data.eval_path={root}/no.tsv", "--workdir={root}/new_files"],
     ["no.tsv: no such file", "data paths"], False),
    ("unknown flag", "train", [*TINY, "--workdr=x"],
     ["Unknown command line flag 'workdr'", "workdir", "--helpshort"], True),
    ("stray argument", "train", [*TINY, "extra"], ["unexpected arguments extra"], True),
    ("flagfile: unknown key", "train", [*TINY, "--flagfile={root}/typo.flags"],
     ["unknown config key 'optim.learnng_rate'", "did you mean 'optim.learning_rate'"], True),
    ("flagfile: missing", "train", [*TINY, "--flagfile={root}/none.flags"],
     ["cannot read a --flagfile", "none.flags", "one flag a line"], True),
    ("bare non-boolean", "train", [*TINY, "--config.train.num_train_steps"],
     ["--config.train.num_train_steps: config key", "not bool", "=VALUE"], True),
    ("negated non-boolean", "train", [*TINY, "--noconfig.optim.learning_rate"],
     ["--noconfig.optim.learning_rate: config key", "is float, not bool"], True),
    ("workdir is a file", "train", [*TINY, "--workdir={file}"],
     ["is a file, not a directory", "choose another workdir"], False),
    ("workdir locked", "train", [*TINY, "--workdir={trained}"],
     ["in use by another training run", "pid {pid}", "host"], False),
    ("altered checkpoint", "train", [*TINY, "--workdir={altered}"],
     ["could be restored", "checksum mismatch in state.params['decoder']['layer_0']['mlp']",
      "move them away"], False),
    ("damaged checkpoint", "train", [*TINY, "--workdir={damaged}"],
     ["could be restored", "step 2", "move them away"], False),
    ("diverged", "train",
     [*TINY, "--config.optim.schedule=constant", "--config.optim.learning_rate=1e30",
      "--workdir={root}/new_nan"],
     ["non-finite loss", "optim.learning_rate", "rerun"], False),
    ("workdir of an older format", "train", [*TINY, "--workdir={older}"],
     ["{older}/config.json was written by tfjax 0.2.0 or earlier",
      "train again in a new --workdir"], False),
    ("evaluate: workdir of an older format", "evaluate", ["--workdir={older}"],
     ["{older}/config.json was written by tfjax 0.2.0 or earlier"], False),
    ("translate: no --workdir", "translate", [], ["missing --workdir"], True),
    ("translate: workdir is a file", "translate", ["--workdir={file}"],
     ["is a file, not a workdir"], True),
    ("translate: empty workdir", "translate", ["--workdir={empty}"],
     ["holds no trained run", "python -m experiments.train"], True),
    ("translate: missing input", "translate", ["--workdir={trained}", "--input={root}/no.txt"],
     ["--input=", "no such file"], True),
    ("translate: altered checkpoint", "translate", ["--workdir={altered}"],
     ["could be restored", "checksum mismatch"], False),
    ("translate: damaged checkpoint", "translate", ["--workdir={damaged}"],
     ["could be restored", "step 2"], False),
    ("translate: bad flag value", "translate", ["--workdir={trained}", "--beam_size=wide"],
     ["--beam_size=wide"], True),
    ("generate: wrong kind", "generate", ["--workdir={trained}", "--prompt=a"],
     ["kind encoder_decoder", "use python -m experiments.translate"], True),
    ("generate: negative temperature", "generate",
     ["--workdir={trained}", "--prompt=a", "--temperature=-1"],
     ["temperature=-1.0 must be >= 0"], True),
    ("generate: top_p", "generate", ["--workdir={trained}", "--prompt=a", "--top_p=1.5"],
     ["top_p=1.5 must be in (0, 1]"], True),
    ("evaluate: unknown split", "evaluate", ["--workdir={trained}", "--split=dev"],
     ["unknown split 'dev'", "test"], True),
    ("evaluate: missing step", "evaluate", ["--workdir={trained}", "--step=7"],
     ["no checkpoint for step 7", "available steps: [2]"], False),
    ("sweep: unknown sweep", "sweep", ["--config=configs/base.py:tiny", "--sweep=nope"],
     ["unknown sweep 'nope'", "lr"], True),
    ("bench: unknown bench", "bench", ["--bench=nope"], ["unknown --bench", "attention"], True),
    ("bench: bad shape", "bench", ["--shape=huge"], ["--shape", "base"], True),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name, module, args, words, early", CASES, ids=[c[0] for c in CASES])
def test_a_user_error_is_one_line_with_status_2(paths, name, module, args, words, early):
    fill = {key: str(value) for key, value in paths.items()} | {"pid": os.getpid()}
    before = {key: _digest(paths[key]) for key in ("trained", "altered", "damaged", "older")}
    if name == "workdir locked":
        with lock.WorkdirLock(paths["trained"]):
            done = _run(module, [arg.format(**fill) for arg in args])
    else:
        done = _run(module, [arg.format(**fill) for arg in args])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("error: "), done.stderr
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:]
    for word in words:
        assert word.format(**fill) in lines[-1], lines[-1]
    if early:
        assert len(lines) == 1, done.stderr
    else:  # the lines before the error are the run's own log (plain lines) or warnings
        assert all(PLAIN_LINE.match(line) or line.startswith("warning: ") for line in lines[:-1])
    assert {key: _digest(paths[key]) for key in before} == before  # nothing saved is lost


@pytest.mark.slow
def test_a_flagfile_and_boolean_flags_configure_a_run(tmp_path):
    flagfile = tmp_path / "tiny.flags"
    flagfile.write_text("\n".join(["--config=configs/base.py:tiny", *TINY[1:]]) + "\n")
    workdir = tmp_path / "run"
    done = tiny_runs.command(
        "train",
        f"--flagfile={flagfile}",
        "--noconfig.train.predict_eos",
        "--config.model.scan_layers",
        f"--workdir={workdir}",
    )
    assert done.returncode == 0, done.stderr
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["data"]["name"] == "reverse" and saved["train"]["num_train_steps"] == 2
    assert saved["train"]["predict_eos"] is False and saved["model"]["scan_layers"] is True


@pytest.mark.slow
def test_debug_shows_the_traceback_and_a_bug_exits_1(paths):
    done = _run("train", [*TINY, "--config.optim.learnng_rate=3", "--debug"])
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "apply_override" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: unknown config key")
    bug = _run("train", [f"--config={paths['buggy']}"])  # a KeyError in the user's config code
    assert bug.returncode == 1
    assert "Traceback" in bug.stderr and "KeyError: 'oops'" in bug.stderr
    assert "error: " not in bug.stderr


def test_the_case_list_has_one_entry_per_name():
    names = [case[0] for case in CASES]
    assert len(names) == len(set(names))
    assert {case[1] for case in CASES} == {"train", "translate", "generate", "evaluate", "sweep",
                                           "bench"}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The persistent compilation cache of the entry points


def test_the_cache_folder_follows_jax_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert cli.default_cache_dir() == tmp_path / "jax"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.default_cache_dir() == tmp_path / "xdg" / "tfjax" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli.default_cache_dir() == tmp_path / "home" / ".cache" / "tfjax" / "jax"


def _misses(cache: pathlib.Path, workdir: pathlib.Path, *flags: str) -> int:
    """Programs the train command compiled with XLA (not read from the cache), fresh workdir."""
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    command = [sys.executable, "-m", "experiments.train", *TINY, f"--workdir={workdir}"]
    done = subprocess.run(
        [*command, f"--compilation_cache_dir={cache}", *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # JAX logs "Finished XLA compilation" for a program read from the cache too, with a hit line.
    compiled = done.stderr.count("Finished XLA compilation of")
    return compiled - done.stderr.count("Persistent compilation cache hit")


@pytest.mark.slow
def test_a_second_run_compiles_nothing_and_a_changed_config_compiles_again(tmp_path):
    cache = tmp_path / "cache"
    assert _misses(cache, tmp_path / "first") > 10  # the step, eval, decoder and small programs
    assert _misses(cache, tmp_path / "second") == 0
    assert _misses(cache, tmp_path / "wider", "--config.model.embed_dim=24") > 0
    assert _misses(cache, tmp_path / "off", "--nocompilation_cache") > 10
    assert len(list(cache.iterdir())) > 10


# ---------------------------------------------------------------------------------------------
# Console output: plain lines, absl's format for --verbose and --log_dir


def _record(level: int, message: str) -> logging.LogRecord:
    record = logging.LogRecord("tfjax.x", level, __file__, 1, message, None, None)
    record.created = time.mktime((2026, 11, 28, 2, 36, 34, 0, 0, -1))  # local time
    return record


def test_console_lines_are_time_and_message_or_a_level_word():
    formatter = cli.ConsoleFormatter()
    assert formatter.format(_record(logging.INFO, "step 100/2000 loss 1.055")) == (
        "02:36:34 step 100/2000 loss 1.055"
    )
    assert formatter.format(_record(logging.DEBUG, "detail")) == "02:36:34 detail"
    assert formatter.format(_record(logging.WARNING, "odd")) == "warning: odd"
    assert formatter.format(_record(logging.ERROR, "bad")) == "error: bad"
    assert formatter.format(_record(logging.CRITICAL, "worse")) == "error: worse"


@pytest.fixture
def root_handlers():
    """Restores the root logger's handlers after the test."""
    root = logging.getLogger()
    saved = list(root.handlers)
    yield root
    root.handlers = saved


def test_console_logs_puts_one_plain_handler_in_place_of_absls(root_handlers):
    absl_handler = absl_logging.get_absl_handler()
    root_handlers.addHandler(absl_handler)
    for _ in range(2):  # a second call replaces the first one's handler
        cli.console_logs()
        console = [h for h in root_handlers.handlers if isinstance(h, cli.ConsoleHandler)]
        assert len(console) == 1 and absl_handler not in root_handlers.handlers
    cli.console_logs(keep_absl=True)  # --log_dir: absl writes the file, the console stays plain
    assert absl_handler in root_handlers.handlers
    assert sum(isinstance(h, cli.ConsoleHandler) for h in root_handlers.handlers) == 1
    cli.console_logs(plain=False)  # --verbose: absl's handler alone
    assert absl_handler in root_handlers.handlers
    assert not any(isinstance(h, cli.ConsoleHandler) for h in root_handlers.handlers)


def test_a_console_line_does_not_break_a_live_progress_bar(monkeypatch):
    from tfjax.training import logger

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    progress = logger.Progress(4, stream=stream, use_bar=True)
    progress.update(1, {"loss": 2.0})
    cli.ConsoleHandler().handle(_record(logging.WARNING, "odd"))
    progress.update(2, {"loss": 1.5})
    progress.close()
    text = stream.getvalue()
    before, line, after = text.partition("warning: odd\n")
    assert line, text
    assert before.rstrip(" ").endswith("\r"), "the bar is cleared before the line"
    assert "1/4" in before and "1/4" in after and "2/4" in after  # ...and drawn again below it


# An entry point that logs like the real ones: tfjax at INFO, a warning, a library's INFO.
DEMO = """
import logging, sys
from experiments import cli

def main(argv):
    cli.quiet_logs()
    logging.getLogger("tfjax.demo").info("step 1/2 loss 1.055")
    logging.getLogger("tfjax.demo").warning("something odd")
    logging.getLogger("orbax.demo").info("library detail")
    print("result line")

cli.main(main, compilation_cache=False, argv=["demo", *sys.argv[1:]])
"""


def _demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", DEMO, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_an_entry_point_logs_plain_lines_and_absls_format_with_verbose(tmp_path):
    plain = _demo()
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "result line\n"
    lines = plain.stderr.splitlines()
    assert len(lines) == 2, plain.stderr
    assert PLAIN_LINE.match(lines[0]) and lines[0].endswith(" step 1/2 loss 1.055"), lines
    assert lines[1] == "warning: something odd"

    verbose = _demo("--verbose")
    assert verbose.returncode == 0 and verbose.stdout == "result line\n", verbose.stderr
    lines = verbose.stderr.splitlines()
    assert len(lines) == 3 and all(ABSL_PREFIX.match(line) for line in lines), lines
    assert lines[2].endswith("] library detail")  # --verbose lets the libraries log at INFO

    logged = _demo(f"--log_dir={tmp_path / 'logs'}")  # the folder is created
    assert logged.returncode == 0, logged.stderr
    assert logged.stderr.splitlines()[1:] == ["warning: something odd"], logged.stderr
    assert PLAIN_LINE.match(logged.stderr)
    (log_file,) = [p for p in (tmp_path / "logs").iterdir() if not p.is_symlink()]
    lines = log_file.read_text().splitlines()
    assert len(lines) == 2 and all(ABSL_PREFIX.match(line) for line in lines), lines


@pytest.mark.slow
def test_a_training_run_prints_no_absl_prefix_unless_verbose(tmp_path):
    workdir = f"--workdir={tmp_path / 'run'}"
    done = tiny_runs.command("train", *TINY, workdir)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines() + done.stderr.splitlines()
    assert not [line for line in lines if ABSL_PREFIX.match(line)], done.stderr
    steps = [line for line in done.stderr.splitlines() if " step 2/2 loss " in line]
    assert len(steps) == 1 and PLAIN_LINE.match(steps[0]), done.stderr
    assert done.stdout.startswith("workdir: ") and "final eval: " in done.stdout

    resumed = tiny_runs.command("train", *TINY, workdir, "--verbose")
    assert resumed.returncode == 0, resumed.stderr
    (line,) = [line for line in resumed.stderr.splitlines() if "resumed from" in line]
    assert ABSL_PREFIX.match(line), line
