"""The results table and the records behind it: `python -m experiments.results [--check]`.

Each published row of the results is a recipe (`ROWS`): a config with its preset, the
evaluation that scores it, and the metric it reports. Each run of a row leaves a record, a
small JSON file in `docs/records/<row>/seed<k>.json` (written by `experiments.reproduce
--record`): the recipe and the exact commands, the seed, the git commit, the versions, the host
with its measured `jnp.dot` ceiling, the wall time of each command and every score the
evaluation wrote. The tables in README.md and docs/results.md are generated from these records
(mean ± sample standard deviation over the seeds, n, the median wall time): this command
rewrites them between their `<!-- results:... -->` markers, and `--check` (run by the tests)
fails when a table and the records disagree, so no figure in them is typed by hand.

A record whose `provenance` is `transcribed` was copied from the run log of a run made before
records existed (its command, date, host and figures as logged then); the tables mark such rows
with † until measured records replace them.

Both forms first check every record (`read_record`, `record_problems`): a file that cannot be
used (cut short, empty, not UTF-8, without a key the tables read, named for another seed, a
folder named like a record) is one line `error: <file> ...: <the fix>` each, the exit status 2,
and no table is written.
"""

import dataclasses
import json
import pathlib
import sys
from collections.abc import Sequence

from experiments import seed_stats
from tfjax import errors

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "records"
TABLES = {  # file -> the table kind it holds between its markers
    ROOT / "README.md": "short",
    ROOT / "docs" / "results.md": "full",
}
BEGIN, END = "<!-- results:{} begin -->", "<!-- results:{} end -->"


@dataclasses.dataclass(frozen=True)
class Row:
    """A published result: how to train it, how to score it, what to report.

    `evaluate` holds the flags of `experiments.evaluate` (beside `--workdir`) that produce the
    reported score, e.g. the decoding chosen on the validation split; `metric` is the key of
    the score in the evaluation record (`eval.json`), shown times `scale` with `digits`.
    `sweep` makes the row a sweep: the flags of `experiments.sweep` beside `--config`,
    `--config.seed` and `--workdir` (`--sweep=NAME` first); the sweep's best trial by final eval
    loss is extracted and scored (`experiments.reproduce`).
    """

    config: str
    task: str
    metric: str
    label: str
    evaluate: tuple[str, ...] = ()
    scale: float = 1.0
    digits: int = 2
    target: str = ""
    sweep: tuple[str, ...] = ()


ROWS = {
    "scan_simple": Row(
        "configs/base.py:cpu",
        "SCAN simple split, test (4,182 commands)",
        "exact_match",
        "greedy exact match (%)",
        evaluate=("--beam_size=1",),
        scale=100,
    ),
    "lm_reverse": Row(
        "configs/lm.py:cpu",
        "`reverse` as a language model, test (1,000)",
        "accuracy",
        "token accuracy (ceiling ≈ 0.58)",
        digits=3,
    ),
    "classify_majority": Row(
        "configs/classify.py:cpu",
        "`majority` of 1-21 bits, test (1,000)",
        "accuracy",
        "accuracy",
        digits=3,
    ),
    "listops_cpu": Row(
        "configs/listops.py:cpu",
        "ListOps, 50-200 tokens, test (1,000)",
        "accuracy",
        "accuracy (%)",
        scale=100,
        digits=1,
    ),
    "multi30k_cpu": Row(
        "configs/multi30k.py:cpu",
        "Multi30k En→De, test2016",
        "bleu",
        "sacreBLEU (beam 5, α 1.4)",
        evaluate=("--split=test2016", "--beam_size=5", "--alpha=1.4"),
        digits=1,
    ),
    "multi30k_hour_long": Row(
        "configs/multi30k.py:hour_long",
        "Multi30k En→De, test2016",
        "bleu",
        "sacreBLEU (beam 5, α 1.0, last 5 averaged)",
        evaluate=("--split=test2016", "--beam_size=5", "--alpha=1.0", "--average_last=5"),
        digits=1,
    ),
    "multi30k_hour_rope_swiglu": Row(
        "configs/multi30k.py:hour_rope_swiglu",
        "Multi30k En→De, test2016",
        "bleu",
        "sacreBLEU (beam 5, α 1.4, last 5 averaged)",
        evaluate=("--split=test2016", "--beam_size=5", "--alpha=1.4", "--average_last=5"),
        digits=1,
        target="≥ 40.0 in ≤ 60 min",
    ),
    "shakespeare_cpu": Row(
        "configs/shakespeare_char.py:cpu",
        "Tiny Shakespeare characters, val",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
    "shakespeare_search_grid": Row(
        "configs/shakespeare_char.py:search_grid_best",
        "Tiny Shakespeare characters, val, the best of a grid of 8",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
    "shakespeare_search_tpe": Row(
        "configs/shakespeare_char.py:search_tpe_best",
        "Tiny Shakespeare characters, val, the best of 8 Optuna TPE trials",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
    "shakespeare_hour_muon": Row(
        "configs/shakespeare_char.py:hour_muon",
        "Tiny Shakespeare characters, val, Muon",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
    "shakespeare_hour_rope_swiglu": Row(
        "configs/shakespeare_char.py:hour_rope_swiglu",
        "Tiny Shakespeare characters, val, context 128",
        "loss",
        "val loss (nats/char)",
        digits=4,
    ),
    "shakespeare_hour_ctx256": Row(
        "configs/shakespeare_char.py:hour_ctx256",
        "Tiny Shakespeare characters, val, context 256",
        "loss",
        "val loss (nats/char)",
        digits=4,
        target="≤ 1.47 in ≤ 60 min",
    ),
    "shakespeare_pbt": Row(
        "configs/shakespeare_char.py:pbt",
        "Tiny Shakespeare characters, val; PBT of 4 trials, best",
        "loss",
        "val loss (nats/char)",
        digits=3,
        sweep=("--sweep=pbt_lr",),
    ),
    "shakespeare_pbt_grid": Row(
        "configs/shakespeare_char.py:pbt",
        "Tiny Shakespeare characters, val; grid of the same 4, best",
        "loss",
        "val loss (nats/char)",
        digits=3,
        sweep=("--sweep=pbt_lr", "--config.sweep.pbt.interval=0"),
    ),
    # docs/results.md, "Tune small, train large": width 256 trained at the learning rate the
    # width-64 proxy's sweep chose, under μP and under the standard parametrization.
    "mup_transfer_w256_mup": Row(
        "configs/mup_transfer.py:w256_mup",
        "Tiny Shakespeare characters, val; width 256, μP, the width-64 proxy's LR",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
    "mup_transfer_w256_standard": Row(
        "configs/mup_transfer.py:w256_standard",
        "Tiny Shakespeare characters, val; width 256, standard, the width-64 proxy's LR",
        "loss",
        "val loss (nats/char)",
        digits=3,
    ),
}


def load_records(row: str, directory: pathlib.Path | None = None) -> list[dict]:
    """The records of `row` (in `directory`, default `RECORDS`), in file-name order (seed0,
    seed1, ...).

    Raises:
        tfjax.errors.DataError: for the first record that cannot be used (`read_record`).
    """
    folder = (RECORDS if directory is None else directory) / row
    return [read_record(path, row) for path in sorted(folder.glob("*.json"))]


def shown(path: pathlib.Path) -> str:
    """`path` as a message gives it: relative to the checkout when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def read_record(path: pathlib.Path, row: str) -> dict:
    """The record in `path`, a file of `row`'s folder, checked for what the tables read.

    Raises:
        tfjax.errors.DataError: naming the file and the fix, for a folder, an unreadable file,
            bytes that are not UTF-8 JSON, or a record without a key the tables read.
    """
    where = shown(path)
    if path.is_dir():
        raise errors.DataError(f"{where} is a folder, not a record file: move it out of the way")
    fix = f"restore it (git checkout -- {where}) or move it out of the way"
    try:
        data = path.read_bytes()
        record = json.loads(data.decode("utf-8")) if data.strip() else None
    except OSError as err:
        raise errors.DataError(f"{where} cannot be read ({err.strerror}): {fix}") from None
    except UnicodeDecodeError as err:
        raise errors.DataError(
            f"{where}: byte {data[err.start]:#04x} at offset {err.start} is not UTF-8: {fix}"
        ) from None
    except json.JSONDecodeError as err:
        raise errors.DataError(f"{where} is not valid JSON ({err}): {fix}") from None
    problem = "is empty" if record is None else _record_problem(record, row, path.name)
    if problem:
        raise errors.DataError(f"{where} {problem}: {fix}")
    return record


def _field(record: dict, *keys: str) -> object:
    """`record[k0][k1]...`, or None where a key or an object on the way is missing."""
    for key in keys:
        if not isinstance(record, dict):
            return None
        record = record.get(key)
    return record


def _record_problem(record: object, row: str, file_name: str) -> str:
    """What keeps `record` (of `row`, read from `file_name`) out of the tables; "" if nothing."""
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not a record (a JSON object)"
    number = lambda x: isinstance(x, int | float) and not isinstance(x, bool)  # noqa: E731
    metric = ROWS[row].metric
    checks = (
        ("row", _field(record, "row") == row, f"the name of its folder, {row!r}"),
        ("seed", isinstance(_field(record, "seed"), int) and number(record["seed"]), "an integer"),
        ("date", isinstance(_field(record, "date"), str), "a string"),
        ("host", isinstance(_field(record, "host"), dict), "an object"),
        ("wall_s.train", number(_field(record, "wall_s", "train")), "a number"),
        (f"metrics.{metric}", number(_field(record, "metrics", metric)), "a number"),
    )
    for key, good, wanted in checks:
        if not good:
            return f"has no key {key!r} that is {wanted}"
    if file_name != f"seed{record['seed']}.json":
        return f"holds seed {record['seed']}, so its name must be seed{record['seed']}.json"
    return ""


def record_problems(
    directory: pathlib.Path | None = None, rows: Sequence[str] | None = None
) -> list[str]:
    """One message per record under `directory` (default `RECORDS`) that cannot be used
    (`read_record`), and per folder there that names no row; [] when all are good. With
    `rows`, only the folders of those rows."""
    directory = RECORDS if directory is None else directory
    if not directory.is_dir():
        return []
    problems = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        if rows is not None and folder.name not in rows:
            continue
        if folder.name not in ROWS:
            problems.append(
                f"{shown(folder)} names no row of experiments.results.ROWS: rename it to its "
                "row or move it out of the way"
            )
            continue
        for path in sorted(folder.glob("*.json")):
            try:
                read_record(path, folder.name)
            except errors.DataError as err:
                problems.append(str(err))
    return problems


@dataclasses.dataclass(frozen=True)
class Summary:
    """A row's figures over its records: the metric's mean, sample std (0 for one run), n."""

    mean: float
    std: float
    n: int
    train_seconds: tuple[float, ...]
    transcribed: bool
    seeds: tuple[int, ...]

    def within(self, value: float, row: Row) -> bool:
        """Whether `value` falls inside the recorded spread: mean ± max(2 std, one unit of the
        last digit shown), in the metric's own units."""
        tolerance = max(2 * self.std, 10.0**-row.digits / row.scale)
        return abs(value - self.mean) <= tolerance


def summarize(row: str, records: list[dict]) -> Summary:
    values = [float(r["metrics"][ROWS[row].metric]) for r in records]
    seconds = tuple(float(r["wall_s"]["train"]) for r in records)
    spread = seed_stats.spread(values)
    return Summary(
        mean=spread.mean,
        std=spread.std,
        n=spread.n,
        train_seconds=seconds,
        transcribed=any(r.get("provenance") == "transcribed" for r in records),
        seeds=tuple(r["seed"] for r in records),
    )


def _figure(summary: Summary, row: Row) -> str:
    mean = f"{summary.mean * row.scale:.{row.digits}f}"
    if summary.n == 1:
        return f"{mean} (n = 1)"
    return f"{mean} ± {summary.std * row.scale:.{row.digits}f} (n = {summary.n})"


def table(kind: str, directory: pathlib.Path | None = None) -> str:
    """The Markdown table of every row with records (in `directory`, default `RECORDS`):
    `short` (README) or `full` (docs)."""
    if kind == "short":
        lines = [
            "| recipe | task | metric | mean ± std (n) | train time | reproduce |",
            "|---" * 6 + "|",
        ]
    else:
        lines = [
            "| row | recipe | task | metric | mean ± std (n) | seeds | train time "
            "| target | dates | hosts (`jnp.dot` GFLOP/s) |",
            "|---" * 10 + "|",
        ]
    for name, row in ROWS.items():
        records = load_records(name, directory)
        if not records:
            continue
        summary = summarize(name, records)
        mark = " †" if summary.transcribed else ""
        recipe = f"`{row.config}`"
        times = sorted(summary.train_seconds)
        time = _duration(times[0]) + (f" - {_duration(times[-1])}" if len(times) > 1 else "")
        if kind == "short":
            lines.append(
                f"| {recipe} | {row.task} | {row.label} | {_figure(summary, row)}{mark} | {time} "
                f"| `python -m experiments.reproduce --row={name}` |"
            )
        else:
            hosts = sorted({_host(r) for r in records})
            seeds = ", ".join(map(str, summary.seeds))
            dates = ", ".join(sorted({r["date"] for r in records}))
            lines.append(
                f"| `{name}` | {recipe} | {row.task} | {row.label} | {_figure(summary, row)}{mark}"
                f" | {seeds} | {time} | {row.target or '-'} | {dates} | {'; '.join(hosts)} |"
            )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """E.g. "28 s", "7 min 34 s"."""
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def _host(record: dict) -> str:
    host = record["host"]
    ceiling = host.get("dot_gflops") or []
    spread = f"{min(ceiling):.0f}-{max(ceiling):.0f}" if ceiling else "?"
    return f"{host.get('cores', '?')}-core {host.get('accelerator', 'cpu')}, {spread}"


def render(text: str, kind: str, directory: pathlib.Path | None = None) -> str:
    """`text` with the table between its markers replaced by the generated one."""
    begin, end = BEGIN.format(kind), END.format(kind)
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"no {begin} ... {end} markers")
    return f"{head}{begin}\n{table(kind, directory)}\n{end}{rest.partition(end)[2]}"


def stale_tables(directory: pathlib.Path | None = None) -> list[str]:
    """The files whose generated table differs from the records (or lacks its markers)."""
    stale = []
    for path, kind in TABLES.items():
        text = path.read_text(encoding="utf-8")
        try:
            if render(text, kind, directory) != text:
                stale.append(str(path.relative_to(ROOT)))
        except ValueError as err:
            stale.append(f"{path.relative_to(ROOT)}: {err}")
    return stale


def main(argv: list[str], records: pathlib.Path | None = None) -> int:
    """Rewrites the tables from the records (in `records`, default `RECORDS`), or with
    `--check` says which differ; first refuses every record that cannot be used, one
    `error:` line each. Returns the exit status: 0, or 2 for errors."""
    if argv[1:] not in ([], ["--check"]):
        print("usage: python -m experiments.results [--check]", file=sys.stderr)
        return 2
    problems = record_problems(records)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    if argv[1:] == ["--check"]:
        stale = stale_tables(records)
        for name in stale:
            print(
                f"error: {name}: the results table differs from docs/records; "
                "run python -m experiments.results",
                file=sys.stderr,
            )
        return 2 if stale else 0
    rendered = {}
    for path, kind in TABLES.items():
        try:
            rendered[path] = render(path.read_text(encoding="utf-8"), kind, records)
        except ValueError as err:
            print(f"error: {path.relative_to(ROOT)}: {err}; put them back", file=sys.stderr)
            return 2
    for path, text in rendered.items():
        path.write_text(text, encoding="utf-8")
        print(f"written: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
