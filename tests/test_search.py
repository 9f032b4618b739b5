"""Tests for Optuna searches: tfjax/runs/search_space.py, tfjax/runs/search.py and
experiments/search.py.

The default tier checks the bookkeeping with a real Optuna study in a journal file and a fake
trainer in place of the vectorised sweep; the slow tier runs real searches in separate
processes: two sharing one study through the journal file, two through a PostgreSQL server
(`TFJAX_TEST_POSTGRES_URL`, which .ci/run sets with .ci/postgres), and one SIGKILLed
mid-generation whose trials another process fails and runs again.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tfjax import errors
from tfjax.runs import search_space

optuna = pytest.importorskip("optuna", reason="Optuna searches need the `search` extra")

from experiments import config_utils  # noqa: E402
from tfjax.runs import search, vsweep  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
POSTGRES = os.environ.get("TFJAX_TEST_POSTGRES_URL")
SPACE = {
    "optim.learning_rate": {"log_uniform": (1e-3, 1e-2)},
    "train.label_smoothing": {"uniform": (0.0, 0.2)},
}


def _spec(**fields):
    raw = {"space": SPACE, "sampler": "random", "pruner": "none", **fields}
    return search_space.parse(raw, "test")


def _make_config(values):
    config = config_utils.load_config("configs/base.py:tiny")
    config_utils.apply_updates(config, values)
    return config


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"space": {"a": {"log_uniform": (0.0, 1.0)}}}, "low > 0"),
        ({"space": {"a": {"uniform": (2.0, 1.0)}}}, "low < high"),
        ({"space": {"a": {"int": (0.5, 3)}}}, "integer bounds"),
        ({"space": {"a": {"normal": (0, 1)}}}, "is not one of"),
        ({"space": {"a": {"categorical": ()}}}, "no categorical choices"),
        ({"space": {}}, "empty"),
        ({"space": SPACE, "sampler": "grid"}, "tpe, random, qmc, cmaes"),
        ({"space": SPACE, "pruner": {"name": "wait"}}, "none, median"),
        ({"space": SPACE, "trials": 0}, "positive integer"),
        ({"space": SPACE, "direction": "up"}, "minimize"),
        ({"space": SPACE, "trails": 3}, "unknown keys ['trails']"),
    ],
)
def test_parse_refuses_a_bad_search_with_the_fix(raw, message):
    with pytest.raises(errors.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        search_space.parse(raw, "get_search('s')")


def test_suggestions_fall_in_their_distributions(tmp_path):
    space = {
        "a": {"log_uniform": (1e-4, 1e-2)},
        "b": {"int": (0, 40), "step": 10},
        "c": {"categorical": ("x", "y")},
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        values = search_space.suggest(study.ask(), space)
        assert 1e-4 <= values["a"] <= 1e-2
        assert values["b"] in (0, 10, 20, 30, 40) and isinstance(values["b"], int)
        assert values["c"] in ("x", "y")


def _fake_train(calls):
    """Trains nothing: each trial's eval loss is 100 x its learning rate at step 2 and its
    final loss 1000 x; records the groups it was given."""

    def train(group, directory, *, judge):
        calls.append((directory.name, [t.name for t in group]))
        judge(2, {i: {"loss": 100 * t.config.optim.learning_rate} for i, t in enumerate(group)})
        return [vsweep.Outcome("ok", {"loss": 1000 * t.config.optim.learning_rate}) for t in group]

    return train


def test_each_trial_is_trained_once_and_told_its_own_result(tmp_path):
    calls = []
    plan = search.Search(
        _spec(trials=7, per_generation=3),
        "s",
        tmp_path / "s",
        _make_config,
        train=_fake_train(calls),
    )
    study = search.run(plan)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 7
    # Generations of 3, 3 and the 1 left; each group's directory named by its first trial.
    assert calls == [
        ("_group-0000", ["trial-0000", "trial-0001", "trial-0002"]),
        ("_group-0003", ["trial-0003", "trial-0004", "trial-0005"]),
        ("_group-0006", ["trial-0006"]),
    ]
    for trial in trials:  # each value is its own trial's (a literal function of its params)
        assert trial.value == pytest.approx(1000 * trial.params["optim.learning_rate"])
        assert trial.intermediate_values == {
            2: pytest.approx(100 * trial.params["optim.learning_rate"])
        }
        assert trial.user_attrs["group"] == calls[trial.number // 3][0]
    assert (tmp_path / "s" / search.JOURNAL).is_file()
    assert search.run(plan) is not None and len(calls) == 3  # a finished study asks no more


def test_a_refused_suggestion_fails_alone_and_the_study_still_completes(tmp_path):
    calls = []
    space = {"optim.warmup_steps": {"int": (0, 1)}, **SPACE}  # rsqrt refuses warmup 0
    spec = search_space.parse(
        {"space": space, "sampler": "random", "pruner": "none", "trials": 6, "seed": 3}, "t"
    )

    def make_config(values):
        return _make_config({**values, "optim.schedule": "rsqrt"})

    study = search.run(search.Search(spec, "s", tmp_path, make_config, train=_fake_train(calls)))
    states = {t.number: t.state.name for t in study.get_trials()}
    refused = [t.number for t in study.get_trials() if t.params["optim.warmup_steps"] == 0]
    assert refused and all(states[n] == "FAIL" for n in refused)
    trained = [name for _, names in calls for name in names]
    assert sorted(trained) == [search.trial_name(n) for n in states if n not in refused]
    assert len(states) == 6  # a refused trial counts: the study does not ask forever


def test_a_trial_without_heartbeat_fails_and_its_suggestion_is_queued(tmp_path):
    plan = search.Search(_spec(trials=2, per_generation=2), "s", tmp_path, _make_config)
    study = search.open_study(plan)
    stale, alive = search.ask(study, plan.spec)
    study._storage.set_trial_system_attr(stale._trial_id, search.HEARTBEAT, time.time() - 100)
    study._storage.set_trial_system_attr(alive._trial_id, search.HEARTBEAT, time.time())
    assert search.fail_stale(study, stale_after=50.0) == [stale.number]
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "WAITING"]
    assert trials[2].user_attrs["retry_of"] == stale.number
    (again,) = search.ask(study, plan.spec)  # the queued one, nothing beyond
    assert again.number == 2 and again.params == stale.params
    assert len(study.get_trials()) == 3


def test_a_preempted_trial_is_queued_again_and_not_counted(tmp_path):
    plan = search.Search(_spec(trials=1, per_generation=1), "s", tmp_path, _make_config)
    study = search.open_study(plan)
    (trial,) = search.ask(study, plan.spec)
    assert search.tell(study, trial, vsweep.Outcome("preempted at step 3", {}), "loss") == "FAIL"
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]
    assert [t.number for t in search.counted(study)] == [1]  # the copy, not the preempted one
    (again,) = search.ask(study, plan.spec)
    assert again.params == trial.params


def test_a_second_process_asks_only_what_is_left(tmp_path):
    spec = _spec(trials=5, per_generation=4)
    first = search.open_study(search.Search(spec, "s", tmp_path, _make_config))
    second = search.open_study(search.Search(spec, "s", tmp_path, _make_config))
    assert len(search.ask(first, spec)) == 4
    assert [t.number for t in search.ask(second, spec)] == [4]
    assert search.ask(second, spec) == []


def test_a_host_that_loses_the_race_to_create_the_rdb_tables_retries(tmp_path, monkeypatch):
    """Two hosts opening a new PostgreSQL study at once: one's `CREATE TYPE` fails as a
    duplicate (seen in CI). Here the first two openings fail that way; the third opens the
    study, and a failure on every attempt is raised, not hidden."""
    import sqlalchemy.exc

    real, failures = optuna.storages.RDBStorage.__init__, [2]

    def racing(self, url, *args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise sqlalchemy.exc.IntegrityError("CREATE TYPE studydirection", {}, Exception("dup"))
        real(self, url, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", racing)
    monkeypatch.setattr(search.time, "sleep", lambda seconds: None)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = search.open_study(search.Search(_spec(), "s", tmp_path, _make_config, storage=url))
    assert study.study_name == "s" and failures == [0]
    failures[0] = search.RDB_ATTEMPTS
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        search.open_study(search.Search(_spec(), "s", tmp_path, _make_config, storage=url))


def test_a_trial_from_a_race_beyond_the_study_is_told_surplus(tmp_path, monkeypatch):
    spec = _spec(trials=2, per_generation=2)
    study = search.open_study(search.Search(spec, "s", tmp_path, _make_config))
    search.ask(study, spec)  # trials 0 and 1
    real, first = search.counted, [True]

    def counted_before_the_others_asked(study):
        return [] if first and first.pop() else real(study)

    # A process that counted before trials 0 and 1 existed asks two more: both beyond 2.
    monkeypatch.setattr(search, "counted", counted_before_the_others_asked)
    assert search.ask(study, spec) == []
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["RUNNING", "RUNNING", "FAIL", "FAIL"]
    assert [t.user_attrs.get(search.STATUS) for t in trials[2:]] == [search.SURPLUS] * 2
    assert [t.number for t in real(study)] == [0, 1]


def test_extracting_a_trial_trained_elsewhere_says_which_host(tmp_path):
    plan = search.Search(_spec(trials=1, per_generation=1), "s", tmp_path, _make_config)
    study = search.open_study(plan)
    (trial,) = search.ask(study, plan.spec)
    trial.set_user_attr("host", "other:42")
    trial.set_user_attr("group", "_group-0000")
    study.tell(trial, 1.0)
    with pytest.raises(errors.ConfigError, match=r"trained on other:42.*extract it on that host"):
        search.extract_best(study, tmp_path)


# --- real searches, in processes of their own ---------------------------------------------

CONFIG = textwrap.dedent("""
    from configs import base

    def get_config(arg=None):
        return base.get_config(arg)

    def get_search(name):
        return {
            "space": {
                "optim.learning_rate": {"log_uniform": (1e-3, 1e-2)},
                "train.label_smoothing": {"uniform": (0.0, 0.2)},
            },
            "trials": TRIALS,
            "per_generation": 2,
            "sampler": "random",
            "pruner": "none",
            "seed": None,
        }
""")
OVERRIDES = [
    "--config.train.num_train_steps=2",
    "--config.train.eval_every_steps=2",
    "--config.train.log_every_steps=2",
    "--config.train.checkpoint_every_steps=2",
    "--config.train.max_eval_examples=8",
    "--config.train.final_eval_examples=8",
    "--config.optim.warmup_steps=1",
]


def _search_command(tmp_path, trials: int, *extra: str) -> list[str]:
    config = tmp_path / "search_config.py"
    config.write_text(CONFIG.replace("TRIALS", str(trials)))
    return [
        sys.executable, "-m", "experiments.search", f"--config={config}:tiny", "--search=s",
        f"--workdir={tmp_path / 'runs'}", "--heartbeat_seconds=1", "--stale_after_seconds=4",
        *OVERRIDES, *extra,
    ]  # fmt: skip


def _start(command, log: pathlib.Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def _study(tmp_path, storage=None):
    spec = search_space.parse({"space": SPACE}, "t")
    return search.open_study(
        search.Search(spec, "s", tmp_path / "runs" / "s", _make_config, storage)
    )


def _check_shared(tmp_path, trials: int, storage=None) -> list:
    """Two processes on one study: every trial finished once, by one of them; both worked."""
    extra = [f"--storage={storage}"] if storage else []
    procs = [
        _start(_search_command(tmp_path, trials, *extra), tmp_path / f"{i}.log") for i in (0, 1)
    ]
    codes = [p.wait(timeout=540) for p in procs]
    assert codes == [0, 0], [(tmp_path / f"{i}.log").read_text()[-3000:] for i in (0, 1)]
    done = _study(tmp_path, storage).get_trials()
    assert [t.state.name for t in done] == ["COMPLETE"] * trials  # none lost, none extra
    assert len({t.user_attrs["host"] for t in done}) == 2  # both processes trained trials
    for t in done:  # trained once: one final evaluation in its metrics.jsonl, one group
        lines = tmp_path / "runs" / "s" / search.trial_name(t.number) / "metrics.jsonl"
        kinds = [json.loads(line)["kind"] for line in lines.read_text().splitlines()]
        assert kinds.count("final_eval") == 1 and kinds.count("startup") == 1
    return done


@pytest.mark.slow
def test_two_processes_share_a_study_through_the_journal_and_the_best_evaluates(tmp_path):
    done = _check_shared(tmp_path, trials=4)
    extracted = subprocess.run(
        [*_search_command(tmp_path, 4), "--extract"], cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)), check=False,
    )  # fmt: skip
    assert extracted.returncode == 0, extracted.stderr[-2000:]
    best = min(done, key=lambda t: t.value)
    workdir = tmp_path / "runs" / "s" / search.trial_name(best.number)
    assert f"trial {best.number}" in extracted.stdout
    evaluated = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", f"--workdir={workdir}", "--max_examples=8"],
        cwd=REPO, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        check=False,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "loss" in json.loads((workdir / "eval.json").read_text())
    assert (tmp_path / "runs" / "s" / "summary.md").read_text().count("| COMPLETE |") == 4


@pytest.mark.slow
@pytest.mark.skipif(
    not POSTGRES,
    reason="no PostgreSQL server: set TFJAX_TEST_POSTGRES_URL (.ci/run starts one with "
    ".ci/postgres start DIR)",
)
def test_two_processes_share_a_study_through_postgresql(tmp_path):
    storage = POSTGRES
    name = f"s{uuid.uuid4().hex[:8]}"  # a study of its own on a server that may be shared
    config_search = f"--search={name}"
    command = _search_command(tmp_path, 4, f"--storage={storage}")
    command[command.index("--search=s")] = config_search
    procs = [_start(command, tmp_path / f"{i}.log") for i in (0, 1)]
    codes = [p.wait(timeout=540) for p in procs]
    assert codes == [0, 0], [(tmp_path / f"{i}.log").read_text()[-3000:] for i in (0, 1)]
    study = optuna.load_study(study_name=name, storage=storage)
    done = study.get_trials()
    assert [t.state.name for t in done] == ["COMPLETE"] * 4
    assert len({t.user_attrs["host"] for t in done}) == 2
    for t in done:
        lines = tmp_path / "runs" / name / search.trial_name(t.number) / "metrics.jsonl"
        kinds = [json.loads(line)["kind"] for line in lines.read_text().splitlines()]
        assert kinds.count("final_eval") == 1


@pytest.mark.slow
def test_a_process_killed_mid_generation_is_failed_and_its_trials_run_again(tmp_path):
    command = _search_command(tmp_path, 2)
    killed = _start(command, tmp_path / "killed.log")
    metrics = tmp_path / "runs" / "s" / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and '"startup"' in metrics.read_text()):
        assert killed.poll() is None and time.monotonic() < deadline, "never started training"
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    second = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)), check=False, timeout=540,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    trials = _study(tmp_path).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]
    assert all(search.STATUS not in t.user_attrs for t in trials[:2])  # failed as stale
    for retry in trials[2:]:
        original = trials[retry.user_attrs["retry_of"]]
        assert retry.params == original.params
    assert "no heartbeat" in second.stderr
