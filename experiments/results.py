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
"""

import dataclasses
import json
import pathlib
import statistics
import sys

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
    """

    config: str
    task: str
    metric: str
    label: str
    evaluate: tuple[str, ...] = ()
    scale: float = 1.0
    digits: int = 2
    target: str = ""


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
}


def load_records(row: str, directory: pathlib.Path = RECORDS) -> list[dict]:
    """The records of `row`, in file-name order (seed0, seed1, ...)."""
    return [json.loads(p.read_text()) for p in sorted((directory / row).glob("*.json"))]


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
    return Summary(
        mean=statistics.fmean(values),
        std=statistics.stdev(values) if len(values) > 1 else 0.0,
        n=len(values),
        train_seconds=seconds,
        transcribed=any(r.get("provenance") == "transcribed" for r in records),
        seeds=tuple(r["seed"] for r in records),
    )


def _figure(summary: Summary, row: Row) -> str:
    mean = f"{summary.mean * row.scale:.{row.digits}f}"
    if summary.n == 1:
        return f"{mean} (n = 1)"
    return f"{mean} ± {summary.std * row.scale:.{row.digits}f} (n = {summary.n})"


def table(kind: str, directory: pathlib.Path = RECORDS) -> str:
    """The Markdown table of every row with records: `short` (README) or `full` (docs)."""
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


def render(text: str, kind: str, directory: pathlib.Path = RECORDS) -> str:
    """`text` with the table between its markers replaced by the generated one."""
    begin, end = BEGIN.format(kind), END.format(kind)
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"no {begin} ... {end} markers")
    return f"{head}{begin}\n{table(kind, directory)}\n{end}{rest.partition(end)[2]}"


def stale_tables() -> list[str]:
    """The files whose generated table differs from the records (or lacks its markers)."""
    stale = []
    for path, kind in TABLES.items():
        text = path.read_text(encoding="utf-8")
        try:
            if render(text, kind) != text:
                stale.append(str(path.relative_to(ROOT)))
        except ValueError as err:
            stale.append(f"{path.relative_to(ROOT)}: {err}")
    return stale


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        stale = stale_tables()
        for name in stale:
            print(
                f"error: {name}: the results table differs from docs/records; "
                "run python -m experiments.results",
                file=sys.stderr,
            )
        return 2 if stale else 0
    if argv[1:]:
        print("usage: python -m experiments.results [--check]", file=sys.stderr)
        return 2
    for path, kind in TABLES.items():
        path.write_text(render(path.read_text(encoding="utf-8"), kind), encoding="utf-8")
        print(f"written: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
