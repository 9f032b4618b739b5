"""A search: Optuna suggests, a vectorised sweep trains, Optuna is told, generation by generation.

`run(search)` opens (or joins) the study in its storage: by default a journal file,
`DIRECTORY/study.journal`; an RDB URL (`sqlite:///...`, `postgresql://...`, `mysql://...`)
when several hosts share one study, each running the same command. Then, until the study holds
`spec.trials` finished trials, each generation

1. fails the trials of processes that died (their heartbeat older than `stale_after` seconds)
   and queues their suggestions again, for whichever process asks next;
2. asks Optuna for up to `spec.per_generation` trials (queued ones first) and keeps those
   within the study's `spec.trials` (a trial another process asked at the same time that would
   go beyond is told failed, "surplus", and never trained);
3. trains them as vectorised programs (`tfjax.runs.vsweep.train_trials`; suggestions that
   change a shape split the generation into groups, one program each), each trial in its
   workdir `DIRECTORY/trial-NNNN` and each group's checkpoints in `DIRECTORY/_group-NNNN`
   (its first trial's number); at each evaluation every live trial reports its eval metric and
   those the pruner picks stop inside the program (`judge`), as successive halving stops them;
4. tells Optuna each trial's final eval metric, or pruned, or failed (non-finite).

While a generation trains, a thread writes each of its trials' heartbeat (a system attribute:
Optuna's own heartbeat exists for RDB storages only, and the journal file needs one too). A
process that waits for the others' trials to end polls the study. `extract_best` writes the best
trial's latest step into its workdir as an ordinary checkpoint (`vsweep_state.extract`).
"""

import dataclasses
import logging
import math
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from tfjax import errors
from tfjax.runs import search_space, validation, vsweep, vsweep_state

log = logging.getLogger(__name__)

JOURNAL = "study.journal"
HEARTBEAT = "tfjax:heartbeat"  # a trial's system attribute: time.time() of its last beat
STATUS = "status"  # a trial's user attribute once told: vsweep's outcome, or "surplus"
SURPLUS = "surplus"
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")


@dataclasses.dataclass
class Search:
    """One process's part in a study.

    Attributes:
        spec: the search (`search_space.parse`).
        name: the study's name in its storage.
        directory: where this process's trials and groups go (the journal file too by default).
        make_config: {dotted key: value} of a suggestion -> the trial's resolved config.
        storage: an RDB URL, or None for the journal file in `directory`.
        heartbeat: seconds between a training trial's heartbeats.
        stale_after: seconds without a heartbeat after which a running trial's process is taken
            for dead (its clock and this host's must agree to well within this).
        train: trains one group (`vsweep.train_trials`'s signature; tests pass their own).
    """

    spec: search_space.SearchSpec
    name: str
    directory: pathlib.Path
    make_config: Callable[[dict[str, Any]], ml_collections.ConfigDict]
    storage: str | None = None
    heartbeat: float = 10.0
    stale_after: float = 60.0
    train: Callable[..., list[vsweep.Outcome]] = vsweep.train_trials


def open_study(search: Search):
    """The study of `search` in its storage, created by the first process that asks."""
    optuna = search_space.require_optuna()
    if search.storage is None:
        search.directory.mkdir(parents=True, exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(str(search.directory / JOURNAL))
        storage = optuna.storages.JournalStorage(backend)
    elif search.storage.partition(":")[0].partition("+")[0] in RDB_SCHEMES:
        storage = _rdb_storage(optuna, search.storage)
    else:
        raise errors.ConfigError(
            f"--storage={search.storage}: give an RDB URL (sqlite:///PATH, postgresql://..., "
            "mysql://...) or leave it out for the journal file in the search's directory"
        )
    study = optuna.create_study(
        study_name=search.name,
        storage=storage,
        direction=search.spec.direction,
        pruner=search_space.make_pruner(search.spec),
        load_if_exists=True,
    )
    study.sampler = search_space.make_sampler(search.spec, offset=len(study.get_trials()))
    return study


# Hosts that start together race to create the RDB's tables (PostgreSQL: a duplicate
# `CREATE TYPE`); the loser retries, and finds them made.
RDB_ATTEMPTS = 5


def _rdb_storage(optuna, url: str):
    """Optuna's RDBStorage of `url`, retried while another process creates its schema."""
    import sqlalchemy.exc  # optuna's dependency, imported with it

    for attempt in range(1, RDB_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url)
        except sqlalchemy.exc.DBAPIError as err:  # IntegrityError, ProgrammingError, ...
            log.warning("opening %s (attempt %d): %s; retrying", url, attempt, type(err).__name__)
            time.sleep(0.5 * attempt)
    return optuna.storages.RDBStorage(url)  # the last attempt raises what it meets


def counted(study) -> list:
    """The study's trials that count towards `spec.trials`, by number: all but the surplus
    and those failed for a dead or preempted process (their suggestions were queued again)."""
    optuna = search_space.require_optuna()
    fail = optuna.trial.TrialState.FAIL

    def counts(trial) -> bool:
        status = trial.user_attrs.get(STATUS)
        if trial.state != fail:
            return True
        return status is not None and status != SURPLUS and not status.startswith(vsweep.PREEMPTED)

    return [t for t in study.get_trials(deepcopy=False) if counts(t)]


def fail_stale(study, stale_after: float) -> list[int]:
    """Fails the running trials whose heartbeat is older than `stale_after` seconds and queues
    their suggestions again; returns their numbers."""
    optuna = search_space.require_optuna()
    now, failed = time.time(), []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        beat = trial.system_attrs.get(HEARTBEAT, trial.datetime_start.timestamp())
        if now - beat < stale_after:
            continue
        try:
            if not study._storage.set_trial_state_values(
                trial._trial_id, optuna.trial.TrialState.FAIL
            ):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process failed it first
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        log.warning("trial %d: no heartbeat for %.0f s; queued again", trial.number, now - beat)
        failed.append(trial.number)
    return failed


def ask(study, spec: search_space.SearchSpec) -> list:
    """Up to `spec.per_generation` new trials with their suggestions, none beyond the study's
    `spec.trials` (a surplus one is told failed at once)."""
    optuna = search_space.require_optuna()
    waiting = optuna.trial.TrialState.WAITING  # queued: `study.ask` hands these out first
    present = [t for t in counted(study) if t.state != waiting]
    room = min(spec.per_generation, spec.trials - len(present))
    asked = []
    for _ in range(max(room, 0)):
        trial = study.ask()
        search_space.suggest(trial, spec.space)
        asked.append(trial)
    numbers = [t.number for t in counted(study)]
    kept = []
    for trial in asked:
        if numbers.index(trial.number) >= spec.trials:
            trial.set_user_attr(STATUS, SURPLUS)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            kept.append(trial)
    return kept


class Heartbeat:
    """A thread that writes the heartbeat of `trials` every `interval` seconds until stopped."""

    def __init__(self, study, trials: Sequence, interval: float):
        self.study, self.ids = study, [t._trial_id for t in trials]
        self.interval, self.stopped = interval, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="search-heartbeat")

    def _beat(self) -> None:
        while True:
            for trial_id in self.ids:
                try:
                    self.study._storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
                except Exception as err:  # a told trial, or a storage hiccup: the next beat
                    log.debug("heartbeat of trial %d: %s", trial_id, err)
            if self.stopped.wait(self.interval):
                return

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def trial_name(number: int) -> str:
    return f"trial-{number:04d}"


def group_directory(directory: pathlib.Path, group: Sequence[vsweep.Trial]) -> pathlib.Path:
    return directory / f"_group-{group[0].name.removeprefix('trial-')}"


def make_judge(trials: Sequence, metric: str) -> vsweep.Judge:
    """The pruner's decisions for one group (`vsweep.train_trials`'s `judge`): each live trial
    reports its eval `metric` at the step and stops when the study's pruner says so."""

    def judge(step: int, results: dict[int, dict[str, float]]) -> dict[int, str]:
        stops = {}
        for index, record in results.items():
            value = float(record[metric])
            trials[index].report(value, step)
            if trials[index].should_prune():
                stops[index] = f"pruned, eval {metric} {value:.4g}"
        return stops

    return judge


def tell(study, trial, outcome: vsweep.Outcome, metric: str) -> str:
    """Tells the study how `trial` ended; returns its Optuna state's name."""
    optuna = search_space.require_optuna()
    state = optuna.trial.TrialState
    trial.set_user_attr(STATUS, outcome.status)
    value = outcome.final.get(metric, math.nan)
    if outcome.status.startswith(vsweep.PREEMPTED):
        study.tell(trial, state=state.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        return "FAIL"
    if outcome.status.startswith("stopped"):
        study.tell(trial, state=state.PRUNED)
        return "PRUNED"
    if outcome.status != "ok" or not math.isfinite(value):
        study.tell(trial, state=state.FAIL)
        return "FAIL"
    study.tell(trial, float(value))
    return "COMPLETE"


def train_generation(search: Search, study, asked: Sequence) -> bool:
    """Trains and tells the trials `asked`; False when a SIGTERM stopped it."""
    by_name, trials = {}, []
    for trial in asked:
        name = trial_name(trial.number)
        trial.set_user_attr("host", f"{socket.gethostname()}:{os.getpid()}")
        try:
            config = search.make_config(trial.params)
            validation.check_config(config)
        except errors.UserError as err:  # a suggestion the config refuses: this trial fails
            log.warning("trial %d failed: %s", trial.number, err)
            tell(study, trial, vsweep.Outcome(f"failed ({err})", {}), search.spec.metric)
            continue
        by_name[name] = trial
        trials.append(vsweep.Trial(name, config, search.directory / name))
    with Heartbeat(study, [by_name[t.name] for t in trials], search.heartbeat):
        for group in vsweep.group_trials(trials):
            directory = group_directory(search.directory, group)
            optuna_trials = [by_name[t.name] for t in group]
            for trial in optuna_trials:
                trial.set_user_attr("group", directory.name)
            log.info("generation: %d trials in %s", len(group), directory)
            judge = make_judge(optuna_trials, search.spec.metric)
            try:
                outcomes = search.train(group, directory, judge=judge)
            except errors.UserError as err:  # a suggestion the config refuses
                log.warning("trials %s failed: %s", [t.name for t in group], err)
                outcomes = [vsweep.Outcome(f"failed ({err})", {}) for _ in group]
            for trial, outcome in zip(optuna_trials, outcomes, strict=True):
                tell(study, trial, outcome, search.spec.metric)
            if any(o.status.startswith(vsweep.PREEMPTED) for o in outcomes):
                return False
    return True


def run(search: Search, *, poll: float | None = None) -> Any:
    """Works on the study until it holds `spec.trials` finished trials, or a SIGTERM; returns
    the study. `poll`: seconds between looks while only other processes' trials run."""
    optuna = search_space.require_optuna()
    study = open_study(search)
    poll = search.heartbeat if poll is None else poll
    running = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING
    while True:
        fail_stale(study, search.stale_after)
        asked = ask(study, search.spec)
        if asked:
            if not train_generation(search, study, asked):
                log.warning("a SIGTERM stopped the generation; rerun the same command to go on")
                return study
            continue
        if not any(t.state in running for t in counted(study)):
            return study
        time.sleep(poll)  # other processes' trials are training


def best(study):
    """The best finished trial of the study."""
    try:
        return study.best_trial
    except ValueError as err:
        raise errors.ConfigError(
            f"study {study.study_name!r} has no completed trial yet: run the search first"
        ) from err


def extract_best(study, directory: pathlib.Path, trial=None) -> tuple[pathlib.Path, int]:
    """Writes the best trial (or `trial`) into its workdir as an ordinary checkpoint; returns
    (the workdir, the step). The trial's group must be in `directory` (the host it ran on)."""
    trial = best(study) if trial is None else trial
    workdir = directory / trial_name(trial.number)
    group = directory / str(trial.user_attrs.get("group", ""))
    if not (group / vsweep_state.CHECKPOINTS).is_dir():
        raise errors.ConfigError(
            f"trial {trial.number} trained on {trial.user_attrs.get('host', 'another host')}: "
            f"its group {group} is not here; extract it on that host"
        )
    return workdir, vsweep_state.extract(group, workdir)
