"""Tests for experiments/config_utils.py: loading specs, typed overrides, argv splitting."""

import json
import pathlib
import re
import textwrap

import pytest

from configs import base, common
from experiments import config_utils
from tfjax import errors

CONFIG_FILE = textwrap.dedent('''
    """A small config for tests."""
    import ml_collections
    from ml_collections import config_dict

    PRESETS = {"base": {}, "small": {"model.num_layers": 1, "optim.learning_rate": 0.5}}
    SWEEPS = {"lr": [{"optim.learning_rate": v} for v in (0.1, 0.2)]}


    def get_config(arg=None):
        config = ml_collections.ConfigDict()
        config.seed = 0
        config.name = "run"
        config.extra = None
        config.placeholder = config_dict.placeholder(int)
        config.model = {"num_layers": 6, "dropout_rate": 0.1, "use_bias": True,
                        "dims": (4, 8), "names": ["a", "b"], "empty": ()}
        config.optim = {"beta": 0.9, "learning_rate": 1.0, "learning_rate_min": 0.0,
                        "warmup_steps": 4000}
        config.update_from_flattened_dict(PRESETS[arg or "base"])
        return config


    def get_sweep(arg):
        if arg not in SWEEPS:
            raise ValueError(f"unknown sweep {arg!r}")
        return SWEEPS[arg]
''')


@pytest.fixture
def spec(tmp_path) -> str:
    path = tmp_path / "small_config.py"
    path.write_text(CONFIG_FILE)
    return str(path)


def test_presets(spec):
    assert config_utils.load_config(spec).model.num_layers == 6
    small = config_utils.load_config(spec + ":small")
    assert (small.model.num_layers, small.optim.learning_rate) == (1, 0.5)


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("seed=3", "seed", 3),
        ("optim.warmup_steps=1e3", "optim.warmup_steps", 1000),
        ("optim.learning_rate=3e-4", "optim.learning_rate", 3e-4),
        ("optim.learning_rate=2", "optim.learning_rate", 2.0),
        ("model.use_bias=false", "model.use_bias", False),
        ("model.use_bias=True", "model.use_bias", True),
        ("model.use_bias=0", "model.use_bias", False),
        ("model.use_bias=1", "model.use_bias", True),
        ("name=a=b", "name", "a=b"),
        ("model.dims=1,2,3", "model.dims", (1, 2, 3)),
        ("model.dims=(16, 32)", "model.dims", (16, 32)),
        ("model.dims=[5]", "model.dims", (5,)),
        ("model.dims=()", "model.dims", ()),
        ("model.names=x,y", "model.names", ["x", "y"]),
        ("model.empty=1,2", "model.empty", (1, 2)),
        ("extra=[1, 2]", "extra", [1, 2]),
        ("extra=0.5", "extra", 0.5),
        ("extra=hello", "extra", "hello"),
        ("placeholder=7", "placeholder", 7),
    ],
)
def test_override_types(spec, override, key, expected):
    config = config_utils.load_config(spec, [override])
    value = config
    for part in key.split("."):
        value = value[part]
    assert value == expected
    assert type(value) is type(expected)


def test_overrides_apply_in_order_after_preset(spec):
    config = config_utils.load_config(spec + ":small", ["model.num_layers=3", "model.num_layers=4"])
    assert config.model.num_layers == 4


def test_unknown_key_lists_close_matches_first(spec):
    with pytest.raises(ValueError) as info:
        config_utils.load_config(spec, ["optim.learnng_rate=1"])
    message = str(info.value)
    assert message.startswith(
        "unknown config key 'optim.learnng_rate'; did you mean 'optim.learning_rate'"
    )
    assert message.endswith(
        "valid keys under 'optim': learning_rate, learning_rate_min, beta, warmup_steps"
    )


def test_unknown_top_level_key(spec):
    with pytest.raises(
        ValueError,
        match=r"unknown config key 'modle\.num_layers'; did you mean 'model'.*at the top level",
    ):
        config_utils.load_config(spec, ["modle.num_layers=2"])
    with pytest.raises(ValueError, match=r"^unknown config key 'zzz'; valid keys at the top"):
        config_utils.load_config(spec, ["zzz=2"])


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        (
            "optim.warmup_steps=1.5",
            r"cannot parse '1.5' as int for config key 'optim.warmup_steps'",
        ),
        ("optim.learning_rate=fast", r"cannot parse 'fast' as float for .*'optim.learning_rate'"),
        ("model.use_bias=yes", r"cannot parse 'yes' as bool for config key 'model.use_bias'"),
        ("model.dims=1,x", r"cannot parse 'x' as int for config key 'model.dims'"),
        ("model=3", r"'model' is a group"),
        ("seed.x=3", r"'seed' is not a group \(type int\); cannot set 'seed.x'"),
        ("seed", r"--config\.seed: config key 'seed' is int, not bool, so it needs a value"),
        ("=3", r"not of the form"),
        ("!seed=1", r"not of the form"),
    ],
)
def test_bad_override_messages(spec, override, pattern):
    with pytest.raises(ValueError, match=pattern):
        config_utils.load_config(spec, [override])


def test_config_is_locked(spec):
    config = config_utils.load_config(spec)
    assert config.is_locked
    with pytest.raises(AttributeError):
        config.new_field = 1
    with pytest.raises(AttributeError):
        config.model.new_field = 1


def test_missing_file_and_get_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.py"):
        config_utils.load_config(str(tmp_path / "nope.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(ValueError, match="defines no get_config"):
        config_utils.load_config(str(empty))
    with pytest.raises(ValueError, match="defines no get_sweep"):
        config_utils.get_sweep(str(empty), "lr")


def test_repository_config_loads_with_overrides():
    root = pathlib.Path(__file__).resolve().parents[1]
    config = config_utils.load_config(
        str(root / "configs" / "base.py") + ":tiny",
        ["train.num_train_steps=3", "optim.learning_rate=0.5"],
    )
    assert (config.train.num_train_steps, config.optim.learning_rate) == (3, 0.5)
    assert config.is_locked


@pytest.mark.parametrize(
    ("argv", "remaining", "overrides"),
    [
        (
            ["prog", "--config=c.py:tiny", "--workdir=w"],
            ["prog", "--config=c.py:tiny", "--workdir=w"],
            [],
        ),
        (
            ["prog", "--config.a.b=1", "--config=c.py", "--config.c", "x y", "-config.d=-1"],
            ["prog", "--config=c.py"],
            ["a.b=1", "c=x y", "d=-1"],
        ),
        (["prog", "--config.a=1", "--", "--config.b=2"], ["prog", "--", "--config.b=2"], ["a=1"]),
        # Bare (followed by a flag, "--" or nothing) and negated booleans; a negative number
        # is a value, not a flag.
        (["prog", "--config.a", "--workdir=w", "--config.b"], ["prog", "--workdir=w"], ["a", "b"]),
        (["prog", "--config.a", "--", "x"], ["prog", "--", "x"], ["a"]),
        (["prog", "--noconfig.a.b", "-noconfig.c", "--config.d", "-1e-3"], ["prog"],
         ["!a.b", "!c", "d=-1e-3"]),
    ],
)  # fmt: skip
def test_split_config_overrides(argv, remaining, overrides):
    assert config_utils.split_config_overrides(argv) == (remaining, overrides)


def test_bare_and_negated_flags_set_booleans():
    spec = "configs/base.py:tiny"
    default = config_utils.load_config(spec)
    assert not default.parallel.distributed and default.train.predict_eos  # both flip below
    remaining, overrides = config_utils.split_config_overrides(
        ["prog", "--config.parallel.distributed", "--noconfig.train.predict_eos"]
    )
    assert remaining == ["prog"]
    config = config_utils.load_config(spec, overrides)
    assert config.parallel.distributed is True and config.train.predict_eos is False
    assert [config_utils.override_flag(o) for o in overrides] == [
        "--config.parallel.distributed",
        "--noconfig.train.predict_eos",
    ]


def test_a_flagfile_holds_config_overrides_and_other_flags(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(
        "# absl's flagfile: one flag a line\n"
        "--config.train.num_train_steps=3\n"
        "--config.model.scan_layers\n"
        "--noconfig.train.predict_eos\n"
        "--workdir=runs/x\n"
    )
    argv = ["prog", "--config=c.py", f"--flagfile={flagfile}", "--config.train.num_train_steps=5"]
    remaining, overrides = config_utils.split_config_overrides(argv)
    assert remaining == ["prog", "--config=c.py", "--workdir=runs/x"]
    assert overrides == [
        "train.num_train_steps=3",
        "model.scan_layers",
        "!train.predict_eos",
        "train.num_train_steps=5",  # later flags win, as absl's do
    ]
    config = config_utils.load_config("configs/base.py:tiny", overrides)
    assert (config.train.num_train_steps, config.model.scan_layers) == (5, True)
    assert config.train.predict_eos is False


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["train.num_train_steps"],
         "--config.train.num_train_steps: config key 'train.num_train_steps' is int, not bool, "
         "so it needs a value: --config.train.num_train_steps=VALUE"),
        (["!optim.learning_rate"],
         "--noconfig.optim.learning_rate: config key 'optim.learning_rate' is float, not bool"),
        (["!model.scan_layerz"], "unknown config key 'model.scan_layerz'; did you mean"),
    ],
)  # fmt: skip
def test_a_bare_or_negated_flag_on_another_type_is_refused(overrides, words):
    with pytest.raises(errors.ConfigError) as info:
        config_utils.load_config("configs/base.py:tiny", overrides)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_flag_errors_are_one_line_each(tmp_path):
    def refusal(argv, spec="configs/base.py:tiny") -> str:
        with pytest.raises(errors.ConfigError) as info:
            config_utils.load_config(spec, config_utils.split_config_overrides(argv)[1])
        assert "\n" not in str(info.value)
        return str(info.value)

    (tmp_path / "typo.flags").write_text("--config.optim.learnng_rate=3\n")
    typo = refusal(["prog", f"--flagfile={tmp_path / 'typo.flags'}"])
    assert "unknown config key 'optim.learnng_rate'; did you mean 'optim.learning_rate'" in typo
    missing = refusal(["prog", f"--flagfile={tmp_path / 'none.flags'}"])
    assert missing.startswith("cannot read a --flagfile: ") and "none.flags" in missing
    valued = refusal(["prog", "--noconfig.parallel.distributed=true"])
    assert valued.startswith("--noconfig.parallel.distributed=true: a --noconfig flag takes no")


def test_load_config_json_round_trips_the_trainer_file(spec, tmp_path):
    from tfjax.runs import workdir_format

    config = config_utils.load_config(spec)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(workdir_format.stamped(workdir_format.config_dict(config))))
    restored = workdir_format.load_config_json(path)
    assert restored.model.dims == [4, 8]
    assert restored.optim.learning_rate == config.optim.learning_rate
    with pytest.raises(AttributeError):
        restored.new_field = 1  # locked
    with pytest.raises(FileNotFoundError, match="tfjax workdir"):
        workdir_format.load_config_json(tmp_path / "missing.json")


def test_get_sweep(spec):
    assert config_utils.get_sweep(spec + ":small", "lr") == [
        {"optim.learning_rate": 0.1},
        {"optim.learning_rate": 0.2},
    ]
    with pytest.raises(ValueError, match=r"unknown sweep 'nope' .*choose one of: lr$"):
        config_utils.get_sweep(spec, "nope")


def test_a_preset_that_sets_a_misspelt_key_is_refused_with_the_close_match():
    for key, hint in [
        ("train.num_train_step", "did you mean 'train.num_train_steps'"),
        ("trian.num_train_steps", "did you mean 'train'"),
        ("model.num_layers.deep", "unknown config key 'model.num_layers.deep'"),
    ]:
        with pytest.raises(errors.ConfigError, match=re.escape(hint)):
            common.apply_preset(base.get_config(), {"typo": {key: 3}}, "typo")


def test_apply_updates_sets_python_values_and_checks_keys_and_types(tmp_path):
    config = config_utils.load_config("configs/base.py:tiny")
    config_utils.apply_updates(
        config, {"optim.learning_rate": 1, "train.num_train_steps": 7, "model.dropout_rate": 0.25}
    )
    assert config.optim.learning_rate == 1.0 and isinstance(config.optim.learning_rate, float)
    assert (config.train.num_train_steps, config.model.dropout_rate) == (7, 0.25)
    with pytest.raises(errors.ConfigError, match=r"did you mean 'optim\.learning_rate'"):
        config_utils.apply_updates(config, {"optim.learnng_rate": 0.1})
    with pytest.raises(errors.ConfigError, match="is a group"):
        config_utils.apply_updates(config, {"optim": 0.1})
    with pytest.raises(errors.ConfigError) as raised:
        config_utils.apply_updates(config, {"train.num_train_steps": "many"})
    assert "num_train_steps" in str(raised.value) and "\n" not in str(raised.value)


def test_presets_overrides_and_sweeps_share_one_unknown_key_check():
    """`configs.common.apply_preset` refuses with `config_utils.check_key`, the message of an
    override, prefixed by the preset's name."""
    config = base.get_config()
    with pytest.raises(errors.ConfigError) as override:
        config_utils.apply_override(config, "train.num_train_step=3")
    with pytest.raises(errors.ConfigError) as preset:
        common.apply_preset(base.get_config(), {"typo": {"train.num_train_step": 3}}, "typo")
    assert str(preset.value) == f"preset 'typo': {override.value}"
    config_utils.check_key(config, "optim.kwargs.b1")  # new to an open group: taken
