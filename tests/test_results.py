"""The results tables against their records, and the reproduce command."""

import json
import math
import pathlib

import pytest
import tiny_runs

from experiments import reproduce, results
from tfjax import errors


def _record(row: str, seed: int, value: float, wall: float = 60.0, **extra) -> dict:
    return {
        "row": row,
        "seed": seed,
        "date": "2026-01-01",
        "host": {"cores": 2, "accelerator": "cpu", "dot_gflops": [100.0, 120.0]},
        "wall_s": {"train": wall},
        "metrics": {results.ROWS[row].metric: value},
        **extra,
    }


def _write(directory: pathlib.Path, *records: dict) -> None:
    for record in records:
        folder = directory / record["row"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"seed{record['seed']}.json").write_text(json.dumps(record))


def test_every_table_is_the_one_its_records_make():
    assert results.stale_tables() == []


def test_every_record_names_a_row_and_holds_its_metric():
    for path in results.RECORDS.glob("*/*.json"):
        record = json.loads(path.read_text())
        assert record["row"] == path.parent.name in results.ROWS, path
        assert results.ROWS[record["row"]].metric in record["metrics"], path
        assert path.name == f"seed{record['seed']}.json", path


def test_summary_is_mean_and_sample_std_over_seeds():
    values = [37.1, 38.0, 38.6]
    records = [_record("multi30k_cpu", s, v) for s, v in enumerate(values)]
    summary = results.summarize("multi30k_cpu", records)
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)  # n - 1
    assert summary.n == 3
    assert summary.mean == pytest.approx(mean)
    assert summary.std == pytest.approx(std)
    assert summary.seeds == (0, 1, 2)


def test_within_the_spread_is_two_std_or_one_shown_digit():
    row = results.ROWS["multi30k_cpu"]  # one decimal shown
    spread = results.summarize(
        "multi30k_cpu", [_record("multi30k_cpu", s, v) for s, v in enumerate([37.0, 38.0, 39.0])]
    )
    assert spread.within(38.0 + 1.99, row) and not spread.within(38.0 + 2.01, row)
    single = results.summarize("multi30k_cpu", [_record("multi30k_cpu", 0, 40.0)])
    assert single.within(40.09, row) and not single.within(40.11, row)


def test_table_rows_come_from_the_records(tmp_path):
    _write(
        tmp_path,
        _record("lm_reverse", 0, 0.570, wall=100),
        _record("lm_reverse", 1, 0.580, wall=130),
        _record("classify_majority", 0, 1.0, provenance="transcribed"),
    )
    short = results.table("short", tmp_path).splitlines()
    assert len(short) == 4  # header, rule, two rows: rows without records are left out
    assert "0.575 ± 0.007 (n = 2)" in short[2] and "1 min 40 s - 2 min 10 s" in short[2]
    assert short[2].startswith("| `configs/lm.py:cpu`")
    command = "`python -m experiments.reproduce --row=classify_majority`"
    assert short[3].endswith(f"1.000 (n = 1) † | 1 min 0 s | {command} |")
    full = results.table("full", tmp_path)
    assert "| 0, 1 |" in full and "2-core cpu, 100-120" in full


def test_render_replaces_only_between_the_markers(tmp_path):
    _write(tmp_path, _record("lm_reverse", 0, 0.5))
    text = "intro\n<!-- results:short begin -->\nold | table\n<!-- results:short end -->\nafter\n"
    rendered = results.render(text, "short", tmp_path)
    assert rendered.startswith("intro\n<!-- results:short begin -->\n| recipe")
    assert rendered.endswith("<!-- results:short end -->\nafter\n")
    assert "old | table" not in rendered and "0.500 (n = 1)" in rendered
    assert results.render(rendered, "short", tmp_path) == rendered
    with pytest.raises(ValueError, match="markers"):
        results.render("no markers here", "short", tmp_path)


def test_reproduce_commands_carry_the_seed_and_the_row_evaluation(tmp_path):
    train, evaluate = reproduce.commands("multi30k_hour_rope_swiglu", 2, tmp_path / "w", False)
    assert "--config=configs/multi30k.py:hour_rope_swiglu" in train
    assert "--config.seed=2" in train and f"--workdir={tmp_path / 'w'}" in train
    assert evaluate[3:] == [
        f"--workdir={tmp_path / 'w'}",
        *results.ROWS["multi30k_hour_rope_swiglu"].evaluate,
    ]
    train, evaluate = reproduce.commands("multi30k_hour_rope_swiglu", 0, tmp_path / "w", True)
    assert "--config.train.num_train_steps=2" in train
    assert "--max_examples=8" in evaluate
    assert not any(a.startswith("--average_last") for a in evaluate)  # one checkpoint only


def test_a_sweep_rows_commands_sweep_extract_its_best_trial_and_evaluate_it(tmp_path):
    sweep, extract, evaluate = reproduce.commands("shakespeare_pbt_grid", 1, tmp_path, False, "b")
    assert sweep[2:] == [
        "experiments.sweep",
        "--config=configs/shakespeare_char.py:pbt",
        "--sweep=pbt_lr",
        "--config.sweep.pbt.interval=0",
        "--config.seed=1",
        f"--workdir={tmp_path}",
        "--nocompilation_cache",
    ]
    assert extract == [*sweep, "--extract=b"]
    assert evaluate[2:] == ["experiments.evaluate", f"--workdir={tmp_path / 'pbt_lr' / 'b'}"]
    (tmp_path / "summary.csv").write_text(
        "run,status,eval/loss\na,ok,1.5\nb,ok,1.25\nc,frozen at step 3,\nd,failed (x),0.5\n"
    )
    assert reproduce.best_trial(tmp_path / "summary.csv") == "b"


def test_verdicts_compare_with_the_recorded_runs():
    recorded = [_record("shakespeare_cpu", s, v) for s, v in enumerate([1.670, 1.672, 1.674])]
    lines = reproduce.verdicts(
        "shakespeare_cpu",
        [_record("shakespeare_cpu", 5, 1.675), _record("shakespeare_cpu", 6, 1.690)],
        recorded,
    )
    assert lines[0].endswith("within the recorded spread")
    assert lines[1].endswith("OUTSIDE it")


def test_reproduce_refuses_an_unknown_row():
    done = tiny_runs.command("reproduce", "--row=scan_simpel")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: --row=scan_simpel: choose one")


@pytest.mark.slow
@pytest.mark.parametrize("row", list(results.ROWS))
def test_every_row_still_trains_and_evaluates(row, tmp_path):
    done = tiny_runs.command(
        "reproduce", f"--row={row}", "--quick", f"--workdir_root={tmp_path}", "--seeds=3"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / f"{row}_quick_seed3" / "record.json").read_text())
    assert record["seed"] == 3 and record["evaluation"]["step"] == 2
    assert math.isfinite(record["metrics"][results.ROWS[row].metric])


# -- bad input: flags and records, refused before anything trains ---------------------------


def _bad_records(directory: pathlib.Path) -> dict[str, str]:
    """A good record of lm_reverse and one of every kind that cannot be used; {file: words}."""
    _write(directory, _record("lm_reverse", 0, 0.5))
    folder = directory / "lm_reverse"
    good = json.dumps(_record("lm_reverse", 4, 0.5))
    (folder / "seed1.json").write_text(good[: len(good) // 2])  # cut short
    (folder / "seed2.json").write_text("")
    (folder / "seed3.json").write_bytes(good.encode().replace(b"cpu", b"\xe9pu"))  # latin-1
    keyless = _record("lm_reverse", 4, 0.5)
    del keyless["metrics"]
    (folder / "seed4.json").write_text(json.dumps(keyless))
    (folder / "seed5.json").write_text("[1, 2]")
    (folder / "seed9.json").mkdir()
    return {
        "seed1.json": "is not valid JSON",
        "seed2.json": "is empty",
        "seed3.json": "byte 0xe9 at offset",
        "seed4.json": "has no key 'metrics.accuracy'",
        "seed5.json": "holds a JSON list, not a record",
        "seed9.json": "is a folder, not a record file",
    }


def test_each_bad_record_is_one_error_line_naming_it_and_no_table_is_written(tmp_path, capsys):
    expected = _bad_records(tmp_path)
    tables = {path: path.read_bytes() for path in results.TABLES}
    for argv in (["results"], ["results", "--check"]):
        assert results.main(argv, tmp_path) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == len(expected)
        for line, (name, words) in zip(lines, sorted(expected.items()), strict=True):
            assert line.startswith(f"error: {tmp_path / 'lm_reverse' / name}")
            assert words in line and ("git checkout" in line or "move it out" in line)
    assert {path: path.read_bytes() for path in results.TABLES} == tables
    with pytest.raises(errors.DataError, match=r"seed1\.json is not valid JSON"):
        results.load_records("lm_reverse", tmp_path)


def test_a_record_under_the_wrong_name_or_row_is_refused(tmp_path):
    _write(tmp_path, _record("lm_reverse", 0, 0.5))
    (tmp_path / "lm_reverse" / "seed0.json").rename(tmp_path / "lm_reverse" / "seed7.json")
    (tmp_path / "lm_revers").mkdir()
    (tmp_path / "shakespeare_cpu").mkdir()
    (tmp_path / "shakespeare_cpu" / "seed0.json").write_text(
        json.dumps(_record("lm_reverse", 0, 0.5))
    )
    problems = results.record_problems(tmp_path)
    assert len(problems) == 3
    assert problems[0].endswith(
        "lm_revers names no row of experiments.results.ROWS: rename it "
        "to its row or move it out of the way"
    )
    assert "seed7.json holds seed 0, so its name must be seed0.json" in problems[1]
    assert "has no key 'row' that is the name of its folder, 'shakespeare_cpu'" in problems[2]
    assert results.record_problems(tmp_path, rows=["shakespeare_cpu"]) == problems[2:]


@pytest.mark.parametrize(
    "seeds, words",
    [
        ("abc", "--seeds=abc: 'abc' is not a seed (an integer >= 0)"),
        ("0,-1", "--seeds=0,-1: '-1' is not a seed"),
        ("", "--seeds=: no seed given"),
        ("5,5", "--seeds=5,5: seed 5 is given twice"),
    ],
)
def test_reproduce_refuses_bad_seeds_before_training(seeds, words, tmp_path):
    done = tiny_runs.command(
        "reproduce", "--row=lm_reverse", "--quick", f"--seeds={seeds}", f"--workdir_root={tmp_path}"
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {words}")
    assert list(tmp_path.iterdir()) == []  # nothing trained


def test_reproduce_checks_every_record_and_workdir_before_training(tmp_path):
    records, root = tmp_path / "records", tmp_path / "runs"
    expected = _bad_records(records)
    done = tiny_runs.command(
        "reproduce", "--row=lm_reverse", f"--records_dir={records}", f"--workdir_root={root}"
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == len(expected) and all(line.startswith("error: ") for line in lines)
    assert all(name in line for line, name in zip(lines, sorted(expected), strict=True))
    assert not root.exists()
    (root / "lm_reverse_quick_seed1").mkdir(parents=True)
    done = tiny_runs.command(
        "reproduce", "--row=lm_reverse", "--quick", "--seeds=0,1", f"--workdir_root={root}"
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {root / 'lm_reverse_quick_seed1'} exists: reproduce trains in fresh workdirs"
        )
    )
    assert not (root / "lm_reverse_quick_seed0").exists()  # the first seed did not train
