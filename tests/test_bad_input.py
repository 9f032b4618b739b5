"""Bad input to the command-line tools: one `error:` line, status 2, and nothing saved lost.

A damaged config.json in a workdir, text that is not UTF-8, an --input that is a directory,
--max_length=0, a SIGTERM before the first training step, translations that all come out empty,
a truncated model.safetensors and a damaged checkpoint. One tiny seq2seq workdir is trained per
module. The tools run in-process (`tool`: the entry point's own flags, parsed by absl, its `main`
and `cli.report`, as `cli.main` runs them); a few also run as `python -m experiments.*`
subprocesses, those that race a signal marked slow.
"""

import copy
import functools
import gc
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import orbax.checkpoint as ocp
import pytest
import tiny_runs
from absl import flags
from absl import logging as absl_logging
from etils import epath
from tiny_runs import REVERSE

from experiments import cli, config_utils, convert, evaluate, generate, translate
from tfjax import errors
from tfjax.parallel import distributed
from tfjax.runs import build, lock, loop, provenance, restoration, run_data, trainer, workdir_format
from tfjax.runs import trained as trained_lib
from tfjax.training import checkpointing
from tfjax.training.checkpointing import checksums, restoring

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--config=configs/base.py:tiny", *(f"--config.{o}" for o in REVERSE)]
BROKEN_JSON = '{"seed": 0, "model":\n'  # "Expecting value: line 2 column 1 (char 21)"
NOT_UTF8 = b"s1 s2\ns3 \xc3( s4\n"  # a Latin-1 "Ã(" on line 2, column 4
# The absl definers `_define_flags` calls; `tool` points them at a FlagValues of its own.
_DEFINERS = (
    "DEFINE_string",
    "DEFINE_integer",
    "DEFINE_float",
    "DEFINE_bool",
    "DEFINE_boolean",
    "DEFINE_multi_string",
    "mark_flag_as_required",
    "mark_flags_as_required",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny seq2seq workdir (2 steps: every translation comes out empty), trained once."""
    path = tmp_path_factory.mktemp("bad_input") / "trained"
    trainer.train_and_evaluate(config_utils.load_config("configs/base.py:tiny", REVERSE), path)
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny random GPT-2 checkpoint directory, as `save_pretrained` writes it."""
    pytest.importorskip("transformers", reason="needs the 'hf' extra: pip install -e .[hf]")
    pytest.importorskip("torch", reason="needs the 'parity' extra (torch)")
    import hf_checkpoints

    directory = tmp_path_factory.mktemp("gpt2")
    hf_checkpoints.gpt2(directory)
    return directory


@pytest.fixture
def tool(monkeypatch, capsys):
    """`tool(module, *args, stdin=b"")` runs `python -m experiments.<module> args` in-process:
    (exit status, stdout, stderr)."""
    verbosity, tfjax_level = absl_logging.get_verbosity(), logging.getLogger("tfjax").level
    monkeypatch.setattr(sys, "unraisablehook", cli._ignore_closed_event_loop(sys.unraisablehook))

    def run(module, *args: str, stdin: bytes = b""):
        values = flags.FlagValues()
        with monkeypatch.context() as patch:
            for name in _DEFINERS:
                definer = functools.partial(getattr(flags, name), flag_values=values)
                patch.setattr(flags, name, definer)
            module._define_flags()
        monkeypatch.setattr(module, "FLAGS", values)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        extra = {"overrides": []} if module is convert else {}
        try:
            module.main(values([module.__name__, *args]), **extra)
            status = 0
        except Exception as error:  # what `cli.main` hands to `cli.report`
            status = cli.report(error)
        captured = capsys.readouterr()
        return status, captured.out, captured.err

    yield run
    absl_logging.set_verbosity(verbosity)  # `main` made them quiet
    logging.getLogger("tfjax").setLevel(tfjax_level)


def _one_error(status: int, err: str, *words: str) -> str:
    """Checks a user error's output: status 2, one `error:` line holding `words`, no traceback."""
    errors_shown = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status == 2 and "Traceback" not in err, err
    assert len(errors_shown) == 1, err
    for word in words:
        assert word in errors_shown[0], errors_shown[0]
    return errors_shown[0]


def _digest(path: pathlib.Path) -> dict[str, str]:
    """Hash of every file under `path` but the lock (what a refused command must not touch)."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != lock.LOCK_FILE
    }


def _copy(trained: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(trained, tmp_path / "workdir"))


def _damage_config_json(path: pathlib.Path) -> pathlib.Path:
    (path / "config.json").write_text(BROKEN_JSON)
    return path / "checkpoints" / "2" / "config" / "metadata"  # the copy the error points to


def _command(module: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return tiny_runs.command(module, *args, stdin=stdin)  # bytes: output as bytes


# ---------------------------------------------------------------------------------------------
# 1. A damaged config.json


def test_a_damaged_config_json_is_one_line_for_every_reader(trained, tool, tmp_path, capsys):
    path = _copy(trained, tmp_path)
    copy = _damage_config_json(path)
    before = _digest(path)
    words = (
        f"{path / 'config.json'} is not valid JSON: Expecting value: line 2 column 1",
        f"cp {copy} {path / 'config.json'}",
    )
    for module, args in [(evaluate, []), (translate, []), (generate, ["--prompt=a"])]:
        _one_error(*tool(module, f"--workdir={path}", *args)[::2], *words)
    with pytest.raises(errors.ConfigError) as info:  # experiments.train --config=W/config.json
        config_utils.load_config(str(path / "config.json"))
    _one_error(cli.report(info.value), capsys.readouterr().err, *words)
    assert _digest(path) == before
    shutil.copyfile(copy, path / "config.json")  # the repair the message gives works
    assert trained_lib.load_config(path).model.kind == "encoder_decoder"


def test_evaluate_command_on_a_damaged_config_json(trained, tmp_path):
    path = _copy(trained, tmp_path)
    _damage_config_json(path)
    done = _command("evaluate", f"--workdir={path}")
    err = done.stderr.decode()
    assert err.strip().splitlines() == [_one_error(done.returncode, err, "is not valid JSON")]


def test_train_refuses_to_resume_over_a_damaged_config_json(trained, tmp_path, capsys):
    path = _copy(trained, tmp_path)
    copy = _damage_config_json(path)
    before = _digest(path)
    config = config_utils.load_config("configs/base.py:tiny", [*REVERSE, "train.num_train_steps=4"])
    with pytest.raises(errors.WorkdirError) as info:
        trainer.train_and_evaluate(config, path)
    words = (f"not resuming {path}, which holds checkpoints", "is not valid JSON", f"cp {copy}")
    _one_error(cli.report(info.value), capsys.readouterr().err, *words)
    assert _digest(path) == before


class _Stop(Exception):
    """Stands in for the rest of a run once what a test looks at is done."""


def _stop(*args, **kwargs):
    raise _Stop


def test_train_warns_before_writing_over_a_damaged_config_json_without_checkpoints(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "config.json").write_text(BROKEN_JSON)
    monkeypatch.setattr(build, "build", _stop)
    config = config_utils.load_config("configs/base.py:tiny", REVERSE)
    with caplog.at_level(logging.WARNING, logger="tfjax"), pytest.raises(_Stop):
        trainer.train_and_evaluate(config, tmp_path)
    assert f"{tmp_path / 'config.json'} is damaged and no checkpoint needs it" in caplog.text


# ---------------------------------------------------------------------------------------------
# 2. Text that is not UTF-8; 3a. --input that is a directory


def test_evaluate_files_that_are_not_utf8_name_the_line(trained, tool, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_bytes(NOT_UTF8)
    ref.write_text("s2 s1\ns4 s3\n")
    before = _digest(trained)
    files = [f"--workdir={trained}", f"--source_file={src}", f"--reference_file={ref}"]
    status, _, err = tool(evaluate, *files)
    _one_error(status, err, f"{src}:2: byte 0xc3 at column 4 is not UTF-8", "re-encode")
    src.write_text("s1 s2\ns3 s4\n")
    ref.write_bytes(NOT_UTF8)
    _one_error(*tool(evaluate, *files)[::2], f"{ref}:2: byte 0xc3 at column 4 is not UTF-8")
    assert _digest(trained) == before


def test_translate_refuses_input_that_is_not_utf8_or_a_directory(trained, tool, tmp_path):
    run = f"--workdir={trained}"
    _one_error(*tool(translate, run, stdin=NOT_UTF8)[::2], "<stdin>:2: byte 0xc3 at column 4")
    (tmp_path / "latin1.txt").write_bytes(NOT_UTF8)
    status, _, err = tool(translate, run, f"--input={tmp_path / 'latin1.txt'}")
    _one_error(status, err, f"{tmp_path / 'latin1.txt'}:2: byte 0xc3 at column 4")
    status, _, err = tool(translate, run, f"--input={tmp_path}")
    _one_error(status, err, f"--input={tmp_path} is a directory, not a text file")


def test_translate_command_refuses_stdin_that_is_not_utf8(trained):
    done = _command("translate", f"--workdir={trained}", stdin=NOT_UTF8)
    err = done.stderr.decode()
    line = _one_error(done.returncode, err, "<stdin>:2: byte 0xc3 at column 4 is not UTF-8")
    assert err.strip().splitlines() == [line] and done.stdout == b""


# ---------------------------------------------------------------------------------------------
# 3b. --max_length=0; 3d. translations that all come out empty


@pytest.mark.parametrize("length", [0, -5])
def test_max_length_below_1_is_refused_alike(trained, tool, length):
    expected = f"error: max_length={length}: max_length must be >= 1, got {length}"
    status, out, err = tool(translate, f"--workdir={trained}", f"--max_length={length}")
    assert _one_error(status, err) == expected and out == ""
    prompt = "--prompt=s1 |"
    status, out, err = tool(generate, f"--workdir={trained}", prompt, f"--max_length={length}")
    assert _one_error(status, err) == expected and out == ""


def test_the_library_refuses_max_length_0(trained):
    with pytest.raises(trained_lib.WorkdirError, match=r"max_length=0: max_length must be >= 1"):
        trained_lib.load(trained).translate(["s1 s2"], beam_size=1, max_length=0)


def test_empty_translations_warn_once_with_their_count(trained, tool, tmp_path):
    status, out, err = tool(translate, f"--workdir={trained}", "--beam_size=1", stdin=b"s1\n\ns2\n")
    assert status == 0 and out == "\n\n\n", err  # the 2-step model stops at once
    warning = "warning: 2 of 2 translations are empty: the model may be undertrained"
    assert [line for line in err.splitlines() if "translations are empty" in line] == [
        warning + " (train it longer, or check --step)"
    ]
    path = _copy(trained, tmp_path)
    status, out, err = tool(evaluate, f"--workdir={path}", "--beam_size=1")
    assert status == 0 and "written: " in out, err
    assert "warning: 10 of 10 translations are empty" in err


# ---------------------------------------------------------------------------------------------
# 3c. SIGTERM before the first step


class _Killed(Exception):
    """What the default SIGTERM action would do to pytest: die (exit 143)."""


@pytest.fixture
def sigterm_kills():
    """SIGTERM raises `_Killed` unless the code under test handles it."""

    def killed(signum, frame):
        raise _Killed

    previous = signal.signal(signal.SIGTERM, killed)
    yield
    signal.signal(signal.SIGTERM, previous)


def _sigterm_during_build(monkeypatch) -> None:
    """The run gets a SIGTERM while it builds (reads data, makes the model), before step 1."""
    original = build.build

    def build_after_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # the handler runs between bytecodes; sleeping lets it in
            time.sleep(0.01)
        return original(*args, **kwargs)

    monkeypatch.setattr(build, "build", build_after_sigterm)


@pytest.mark.parametrize("resumed", [False, True], ids=["new", "resumed"])
def test_sigterm_before_the_first_step_stops_with_one_line(
    trained, tmp_path, monkeypatch, caplog, sigterm_kills, resumed
):
    path = _copy(trained, tmp_path) if resumed else tmp_path / "new"
    before = _digest(path) if resumed else {}
    _sigterm_during_build(monkeypatch)
    config = config_utils.load_config("configs/base.py:tiny", [*REVERSE, "train.num_train_steps=4"])
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        assert trainer.train_and_evaluate(config, path) == {}
    stopped = [r.getMessage() for r in caplog.records if "SIGTERM" in r.getMessage()]
    kept = "the newest checkpoint is still step 2" if resumed else "no checkpoint was saved"
    assert len(stopped) == 1 and "stopped by SIGTERM before the first step" in stopped[0]
    assert kept in stopped[0]
    assert _digest(path) == before  # nothing written, nothing lost
    with lock.held(path):  # released
        pass


def test_an_early_sigterm_swallowed_where_it_landed_still_stops_before_the_first_step(
    tmp_path, monkeypatch, caplog, sigterm_kills
):
    """The handler runs wherever the main thread is; in a garbage-collector callback (as JAX's)
    Python prints its exception and goes on, and the run once trained to the end."""
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: swallowed.append(info.exc_type))
    original = build.build

    def build_with_sigterm_in_a_gc_callback(*args, **kwargs):
        def deliver(phase, info):
            if phase == "start" and not swallowed:
                signal.raise_signal(signal.SIGTERM)

        gc.callbacks.append(deliver)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(deliver)
        return original(*args, **kwargs)

    monkeypatch.setattr(build, "build", build_with_sigterm_in_a_gc_callback)
    config = config_utils.load_config("configs/base.py:tiny", [*REVERSE, "train.num_train_steps=4"])
    with caplog.at_level(logging.WARNING, logger="tfjax"):
        assert trainer.train_and_evaluate(config, tmp_path / "run") == {}
    assert swallowed == [trainer.Terminated]
    stopped = [r.getMessage() for r in caplog.records if "SIGTERM" in r.getMessage()]
    assert len(stopped) == 1 and "stopped by SIGTERM before the first step" in stopped[0]
    assert workdir_format.saved_steps(tmp_path / "run") == []


@pytest.mark.slow
def test_train_command_stopped_by_sigterm_before_the_first_step(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "experiments.train", *TINY, f"--workdir={tmp_path}"]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.time() + 120
    while not (tmp_path / lock.LOCK_FILE).exists() and time.time() < deadline:
        time.sleep(0.02)  # the lock is taken once SIGTERM is handled, long before step 1
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err  # as a SIGTERM in the loop
    lines = [line for line in err.splitlines() if "SIGTERM" in line]
    assert len(lines) == 1 and "stopped by SIGTERM before the first step" in lines[0], err
    assert "no checkpoint was saved" in lines[0] and "Traceback" not in err
    assert workdir_format.saved_steps(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 4. A truncated Hugging Face weights file


def test_convert_names_a_truncated_weights_file(gpt2_dir, tool, tmp_path):
    import torch
    from safetensors import torch as safetensors_torch

    hf_dir = pathlib.Path(shutil.copytree(gpt2_dir, tmp_path / "hf"))
    weights, torch_file = hf_dir / "model.safetensors", hf_dir / "pytorch_model.bin"
    torch.save(safetensors_torch.load(weights.read_bytes()), torch_file)
    raw = weights.read_bytes()  # the reader maps the file: cut a copy of it, not the mapping
    weights.write_bytes(raw[: len(raw) // 2])
    args = [f"--hf_dir={hf_dir}", f"--workdir={tmp_path / 'run'}"]
    words = ["is damaged or incomplete (", "incomplete metadata", "download it again"]
    _one_error(*tool(convert, *args)[::2], f"{weights} ", *words)
    weights.unlink()  # the same for PyTorch's file
    torch_file.write_bytes(torch_file.read_bytes()[: torch_file.stat().st_size // 2])
    words = [f"{torch_file} is damaged or incomplete (", "download it again"]
    _one_error(*tool(convert, *args)[::2], *words)
    assert not (tmp_path / "run").exists()


def test_convert_command_names_a_truncated_safetensors_file(gpt2_dir, tmp_path):
    hf_dir = pathlib.Path(shutil.copytree(gpt2_dir, tmp_path / "hf"))
    weights = hf_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    done = _command("convert", f"--hf_dir={hf_dir}", f"--workdir={tmp_path / 'run'}")
    err = done.stderr.decode()
    line = _one_error(done.returncode, err, f"{weights} is damaged or incomplete")
    assert err.strip().splitlines() == [line]


# ---------------------------------------------------------------------------------------------
# 5. A damaged checkpoint


def _truncate_data_files(step_dir: pathlib.Path) -> None:
    """Cuts each file of orbax's `d/` folders of the step in half (a copy that stopped early)."""
    for data in step_dir.glob("state/**/d/*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def test_a_damaged_checkpoint_names_the_step_the_file_and_why(trained, tool, tmp_path):
    path = _copy(trained, tmp_path)
    _truncate_data_files(path / "checkpoints" / "2")
    before = _digest(path)
    status, _, err = tool(translate, f"--workdir={path}")
    state = path / "checkpoints" / "2" / "state"
    words = ["tried step 2: array ", f" {state}/", " is damaged or cut short (OUT_OF_RANGE: "]
    line = _one_error(status, err, *words)
    assert "TensorStore" not in line and "tensorstore_spec" not in line
    json_item = path / "checkpoints" / "2" / "rng" / "metadata"
    json_item.write_text('{"impl": ')  # cut short
    words = [f"tried step 2: ValueError: file {json_item} is damaged or cut short (not JSON: "]
    _one_error(*tool(translate, f"--workdir={path}")[::2], *words)
    before.pop(str(json_item.relative_to(path)))
    assert {k: v for k, v in _digest(path).items() if k in before} == before


def test_a_read_error_is_shown_without_the_tensorstore_repr(tmp_path, capsys, monkeypatch):
    # What orbax raises for an array it opened but could not read (a data file cut short,
    # reproduced by hand: where orbax puts the arrays varies from save to save).
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "commit_success.txt").write_text("")
    cause = ValueError(
        'OUT_OF_RANGE: Error reading "params.kernel/0.0" in OCDBT database at local file '
        f'"{tmp_path}/2/state/": Requested byte range [0, 15151) is not valid for value of size '
        '7876 [tensorstore_spec=\'{"driver":"zarr"}\']'
    )
    repr_dump = (
        "Encountered error while reading array index: (slice(0, 64, 1),). See full TensorStore "
        "details: <bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx"
        "_use_cxx11_abi_1.spec of TensorStore({\n  'driver': 'zarr',\n})>."
    )

    def restore(step, args):
        raise Exception(repr_dump) from cause

    manager = ocp.CheckpointManager(tmp_path)
    monkeypatch.setattr(manager, "restore", restore)
    with pytest.raises(checkpointing.CheckpointRestoreError) as info:
        restoring.restore_first_good(
            manager, epath.Path(tmp_path), {}, [2], damaged=set(), fallback=False
        )
    words = [
        f"(tried step 2: array params.kernel: a file under {tmp_path}/2/state/ is damaged or cut "
        "short (OUT_OF_RANGE: Requested byte range [0, 15151) is not valid for value of size "
        "7876))"
    ]
    line = _one_error(cli.report(info.value), capsys.readouterr().err, *words)
    assert "TensorStore" not in line and "bound method" not in line and "spec" not in line


def test_a_checksum_program_fault_names_the_cache_to_delete(tmp_path, capsys):
    error = checkpointing.VerificationError("could not check checkpoint step 2: not damage")
    names = ("jax_compilation_cache_dir", "jax_enable_compilation_cache")
    before = {name: getattr(jax.config, name) for name in names}
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "cache"))
        jax.config.update("jax_enable_compilation_cache", True)
        words = ["not damage; rerun with --nocompilation_cache", f"compilation cache {tmp_path}"]
        _one_error(cli.report(error), capsys.readouterr().err, *words)
        jax.config.update("jax_enable_compilation_cache", False)  # no cache in use
        line = _one_error(cli.report(error), capsys.readouterr().err, "not damage")
        assert "cache" not in line
    finally:
        for name, value in before.items():
            jax.config.update(name, value)


@pytest.mark.slow
def test_translate_command_on_a_damaged_checkpoint(trained, tmp_path):
    path = _copy(trained, tmp_path)
    _truncate_data_files(path / "checkpoints" / "2")
    done = _command("translate", f"--workdir={path}", stdin=b"s1 s2\n")
    err = done.stderr.decode()
    line = _one_error(done.returncode, err, "tried step 2: array ", "is damaged or cut short (")
    assert "TensorStore" not in err and "bound method" not in err
    before = err.strip().splitlines()[:-1]  # the console's log: time and message, or warnings
    assert all(re.match(r"\d\d:\d\d:\d\d |warning: ", line) for line in before), err
    assert err.strip().splitlines()[-1] == line


# ---------------------------------------------------------------------------------------------
# 6. The workdir's tokenizer: damaged, missing, another one (one line naming the file, whatever
# reads it; never rebuilt; a tokenizer of another size is a mismatch, not damaged checkpoints)

TOKENIZER_DAMAGES = {
    "random": lambda data: bytes(range(256)) * 2,
    "cut in half": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "not UTF-8": lambda data: data.replace(b"s1", b"s\xe91"),  # a Latin-1 byte
    "no words": lambda data: b'{"format": "tfjax.WordTokenizer/1"}',
}
RESUME = [*REVERSE, "train.num_train_steps=4"]


def _every_reader(tool, path: pathlib.Path, capsys, *words: str) -> list[str]:
    """The error line of translate, evaluate and a resumed train on `path` (each checked to
    be one line holding `words`), and that none of them changed a file."""
    before = _digest(path)
    lines = [
        _one_error(*tool(module, f"--workdir={path}")[::2], *words)
        for module in (translate, evaluate)
    ]
    config = config_utils.load_config("configs/base.py:tiny", RESUME)
    with pytest.raises(errors.UserError) as info:
        trainer.train_and_evaluate(config, path)
    lines.append(_one_error(cli.report(info.value), capsys.readouterr().err, *words))
    assert _digest(path) == before
    return lines


def _recorded(path: pathlib.Path) -> str:
    """The SHA-256 config.json records for the workdir's tokenizer.json."""
    return json.loads((path / "config.json").read_text())["tokenizer_sha256"]["tokenizer.json"]


@pytest.mark.parametrize("damage", list(TOKENIZER_DAMAGES))
def test_a_damaged_tokenizer_is_one_line_naming_it(trained, tool, tmp_path, capsys, damage):
    path = _copy(trained, tmp_path)
    file = path / "tokenizer.json"
    file.write_bytes(TOKENIZER_DAMAGES[damage](file.read_bytes()))
    words = (f"{file} is not a saved WordTokenizer", "put the original back", _recorded(path))
    for line in _every_reader(tool, path, capsys, *words):
        assert "checkpoint step" not in line and "could be restored" not in line


def test_a_missing_tokenizer_is_refused_never_rebuilt(trained, tool, tmp_path, capsys):
    path = _copy(trained, tmp_path)
    (path / "tokenizer.json").unlink()
    words = (
        f"{path / 'tokenizer.json'} is missing, but the checkpoints in {path} were trained",
        f"SHA-256 {_recorded(path)}",  # what was expected
    )
    _every_reader(tool, path, capsys, *words)
    assert not (path / "tokenizer.json").exists()


def test_every_process_refuses_a_missing_tokenizer_before_waiting(trained, tmp_path, monkeypatch):
    """Multi-process: process 0 alone refusing would leave the others waiting at the barrier
    for the tokenizer it saves (until JAX aborts them), and they must not build it again."""
    path = _copy(trained, tmp_path)
    (path / "tokenizer.json").unlink()
    config = config_utils.load_config("configs/base.py:tiny", RESUME)
    barriers = []
    monkeypatch.setattr(distributed, "barrier", barriers.append)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    for index in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        with pytest.raises(errors.DataError, match=r"tokenizer\.json is missing, but the checkpo"):
            run_data.load_examples(config, path)
    assert barriers == [] and not (path / "tokenizer.json").exists()


def test_another_tokenizer_is_refused_naming_both_digests(trained, tool, tmp_path, capsys):
    path = _copy(trained, tmp_path)
    file = path / "tokenizer.json"
    payload = json.loads(file.read_text())
    payload["words"][4], payload["words"][5] = payload["words"][5], payload["words"][4]
    file.write_text(json.dumps(payload))  # the same size, other ids: only the digest tells
    actual = hashlib.sha256(file.read_bytes()).hexdigest()
    words = (f"{file} is not the tokenizer", f"SHA-256 is {actual}", f"records {_recorded(path)}")
    _every_reader(tool, path, capsys, *words)


def _older_workdir(path: pathlib.Path) -> None:
    """Makes `path` a workdir from before the tokenizer's digest was recorded."""
    tree = json.loads((path / "config.json").read_text())
    tree.pop("tokenizer_sha256", None)
    (path / "config.json").write_text(json.dumps(tree, indent=2))


def test_a_smaller_tokenizer_is_a_mismatch_not_damaged_checkpoints(trained, tool, tmp_path, capsys):
    path = _copy(trained, tmp_path)
    _older_workdir(path)  # nothing recorded to compare it with: the shapes tell
    file = path / "tokenizer.json"
    payload = json.loads(file.read_text())
    file.write_text(json.dumps({**payload, "words": payload["words"][:-3]}))
    words = (f"{file} (11 tokens) disagrees with them", "saved (14, 32), this run (11, 32)")
    for line in _every_reader(tool, path, capsys, *words, "not damaged"):
        assert "move them away" not in line and "could be restored" not in line


def _mismatch(shapes: dict) -> checkpointing.CheckpointMismatchError:
    lines = [f"{key}: saved {old}, this run {new}" for key, (old, new) in shapes.items()]
    return checkpointing.CheckpointMismatchError(
        "the plain message", step=2, saved_config=None, differences=lines, shapes=shapes
    )


def test_a_mismatch_names_only_what_changes_the_shapes(tmp_path):
    current = workdir_format.config_dict(config_utils.load_config("configs/base.py:tiny", RESUME))
    explain = functools.partial(
        provenance.explain_mismatch,
        current=current,
        workdir=tmp_path,
        vocab_size=11,
        config_file=False,
        shapes=functools.partial(restoration._state_shapes, vocab_size=11),
        ignore=workdir_format.LAYOUT_KEYS,
    )
    saved = copy.deepcopy(current)  # settings that change no array
    saved["optim"]["learning_rate"], saved["model"]["dropout_rate"] = 0.5, 0.3
    embed = _mismatch({"state.params['shared_embedding']": ((14, 32), (11, 32))})
    message = str(explain(embed, saved=saved))  # a tokenizer swap, and a new learning rate
    assert "tokenizer.json (11 tokens) disagrees with them" in message
    assert "learning_rate" not in message and "dropout" not in message
    saved["model"]["num_layers"] = 2
    message = str(explain(_mismatch({"state.params['x']": (None, (4,))}), saved=saved))
    assert "config disagrees with them (model.num_layers: checkpoint 2, now 1)" in message
    other = _mismatch({"state.params['x']": ((4, 32), (8, 32))})  # not vocabulary-sized
    assert explain(other, saved=None) is other
    assert explain(embed, saved=None) is not embed  # the tokenizer, as before


def test_an_older_workdir_is_taken_and_recorded_by_the_next_run(
    trained, tool, tmp_path, monkeypatch
):
    path = _copy(trained, tmp_path)
    _older_workdir(path)
    status, _, err = tool(translate, f"--workdir={path}", "--beam_size=1", stdin=b"s1\n")
    assert status == 0 and "error" not in err, err
    monkeypatch.setattr(loop.Loop, "run", _stop)  # config.json is written before it
    with pytest.raises(_Stop):
        trainer.train_and_evaluate(config_utils.load_config("configs/base.py:tiny", RESUME), path)
    assert _recorded(path) == hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest()


def test_a_failing_checksum_program_is_not_called_damage(trained, tool, tmp_path, monkeypatch):
    # What a compilation cache whose entries were swapped does (the real one: the slow test).
    path = _copy(trained, tmp_path)
    before = _digest(path)

    def swapped(leaves):
        raise AssertionError((1, len(leaves)))

    monkeypatch.setattr(checksums, "_all_checksums", swapped)
    for module in (translate, evaluate):
        status, _, err = tool(module, f"--workdir={path}")
        words = (
            "could not check checkpoint step 2",
            "--nocompilation_cache",
            "not known to be damaged",
        )
        _one_error(status, err, *words)
        assert "warning" not in err and "move them away" not in err, err
    assert _digest(path) == before


@pytest.mark.slow
def test_translate_command_with_a_swapped_compilation_cache(trained, tmp_path):
    cache = tmp_path / "cache"
    first = _command(
        "translate", f"--workdir={trained}", f"--compilation_cache_dir={cache}", stdin=b"s1\n"
    )
    assert first.returncode == 0, first.stderr.decode()
    entries = sorted(p for p in cache.iterdir() if not p.name.endswith("-atime"))
    contents = [p.read_bytes() for p in entries]
    for entry, content in zip(entries, contents[1:] + contents[:1], strict=True):
        entry.write_bytes(content)  # every entry holds another program
    done = _command(
        "translate", f"--workdir={trained}", f"--compilation_cache_dir={cache}", stdin=b"s1\n"
    )
    err = done.stderr.decode()
    _one_error(done.returncode, err, "compilation cache", "not known to be damaged")
    assert "damaged checkpoint" not in err and "move them away" not in err
