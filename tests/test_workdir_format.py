"""tfjax.runs.workdir_format: config.json written and read, the workdir format's one check,
the one resumability check and the scan-layout conversion."""

import json
import pathlib

import pytest

import tfjax
from experiments import config_utils
from tfjax import errors, models
from tfjax.runs import workdir_format
from tfjax.training import checkpointing


def _config():
    return config_utils.load_config("configs/base.py:tiny")


def write_older(path: pathlib.Path, tree: dict) -> None:
    """Writes `tree` (a config as JSON) as a tfjax that recorded no workdir format wrote it."""
    tree = {k: v for k, v in tree.items() if k != workdir_format.FORMAT_RECORD}
    path.write_text(json.dumps(tree, indent=2))


def assert_refused(path: pathlib.Path, writer: str = "tfjax 0.2.0 or earlier") -> str:
    """`load_config_json(path)` refuses the file in one line naming the version that wrote it
    and what to do; returns the line."""
    with pytest.raises(errors.WorkdirError) as raised:
        workdir_format.load_config_json(path)
    message = str(raised.value)
    assert "\n" not in message and isinstance(raised.value, errors.UserError)
    assert message.startswith(f"{path} was written by {writer}")
    assert f"reads workdir format {workdir_format.FORMAT_VERSION} only" in message
    assert "train again in a new --workdir" in message
    return message


def test_config_json_records_the_format_and_reads_back(tmp_path):
    config = _config()
    workdir_format.write_config_json(tmp_path, config)
    tree = json.loads((tmp_path / "config.json").read_text())
    assert tree[workdir_format.FORMAT_RECORD] == {"version": 1, "tfjax": tfjax.__version__}
    loaded = workdir_format.load_config_json(tmp_path / "config.json")
    assert workdir_format.config_dict(loaded) == workdir_format.config_dict(config)
    assert workdir_format.FORMAT_RECORD not in loaded  # a record, not a setting


def test_a_config_json_without_a_format_record_is_refused_in_one_line(tmp_path):
    write_older(tmp_path / "config.json", workdir_format.config_dict(_config()))
    assert_refused(tmp_path / "config.json")


def test_another_format_is_refused_naming_the_version_that_wrote_it(tmp_path):
    tree = workdir_format.stamped(workdir_format.config_dict(_config()))
    tree[workdir_format.FORMAT_RECORD] = {"version": 7, "tfjax": "9.1.0"}
    (tmp_path / "config.json").write_text(json.dumps(tree))
    assert_refused(tmp_path / "config.json", "tfjax 9.1.0 (workdir format 7)")


def test_a_checkpoint_copy_of_another_format_is_refused(tmp_path):
    copy = tmp_path / "checkpoints" / "4" / checkpointing.CONFIG_COPY
    copy.parent.mkdir(parents=True)
    write_older(copy, workdir_format.config_dict(_config()))
    with pytest.raises(errors.WorkdirError, match=r"was written by tfjax 0\.2\.0 or earlier"):
        workdir_format.newest_checkpoint_config(tmp_path / "checkpoints")
    copy.write_text(json.dumps(workdir_format.stamped({"model": {}})))
    assert workdir_format.newest_checkpoint_config(tmp_path / "checkpoints") == json.loads(
        copy.read_text()
    )


def test_check_resumable_names_the_key_and_ignores_the_layout():
    saved = workdir_format.config_dict(_config())
    current = json.loads(json.dumps(saved))
    current["model"]["scan_layers"] = not saved["model"]["scan_layers"]
    current["optim"]["learning_rate"] = 0.5  # not a resumability section
    workdir_format.check_resumable(saved, current)
    current["data"]["max_source_len"] += 1
    with pytest.raises(errors.CheckpointError, match=r"data\.max_source_len: saved"):
        workdir_format.check_resumable(saved, current)
    workdir_format.check_resumable(saved, current, sections=("model",))  # init_from's
    with pytest.raises(errors.CheckpointError, match=r"model\.scan_layers"):
        workdir_format.check_resumable(saved, current, sections=("model",), ignore=())


@pytest.mark.parametrize("saved_scan", [False, True])
def test_layout_conversion_only_for_the_other_layout(saved_scan):
    convert = workdir_format.layout_conversion(models.ModelConfig(scan_layers=True))
    conversion = convert({"model": {"scan_layers": saved_scan}}, frozenset())
    assert (conversion is None) == saved_scan
