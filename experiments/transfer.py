"""The learning-rate transfer of a width × parametrization × learning-rate × seed sweep.

    python -m experiments.transfer --sweep_dir=runs/sweeps/transfer[,runs/sweeps/OTHER] \
        [--out=experiments/figures/mup_transfer.png]

Reads, in every sweep directory given, each trial's `config.json` (`model.parametrization`,
`model.embed_dim`, `optim.learning_rate`, `seed`) and the loss of its last `final_eval` record in
`metrics.jsonl` (a trial without one, or with a non-finite loss, diverged: it counts as
infinite), and prints
Markdown: for each parametrization and width, the best learning rate (the lowest mean loss over
the seeds) with the spread of the seeds' own best learning rates, and the loss there
(mean ± sample std); then, per parametrization, the widest model's loss at the learning rate
chosen at the narrowest width against the best of its own sweep. `--out` draws the loss against
the learning rate, one curve per width, the parametrizations side by side (the `viz` extra).

`collect` and `analyse` are pure; only `draw` imports matplotlib (`tfjax.viz.canvas`).
"""

import json
import math
import pathlib
import statistics
from collections import defaultdict

from absl import flags

from experiments import cli
from tfjax.training import logger
from tfjax.viz import canvas

FLAGS = flags.FLAGS


def _final_loss(workdir: pathlib.Path) -> float:
    evals = [r for r in logger.read_metrics(workdir) if r.get("kind") == "final_eval"]
    loss = float(evals[-1]["loss"]) if evals else math.inf
    return loss if math.isfinite(loss) else math.inf


def collect(*sweep_dirs: pathlib.Path) -> dict:
    """{parametrization: {width: {lr: {seed: final eval loss}}}} of the trials in `sweep_dirs`
    (a trial's workdir without a config.json never started: left out)."""
    table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    files = [f for d in sweep_dirs for f in sorted(d.glob("*/config.json"))]
    for config_file in files:
        if config_file.parent.name.startswith("_"):  # the groups' own workdirs
            continue
        config = json.loads(config_file.read_text())
        model, lr = config["model"], config["optim"]["learning_rate"]
        loss = _final_loss(config_file.parent)
        table[model["parametrization"]][model["embed_dim"]][lr][config["seed"]] = loss
    return table


def _mean_std(values: list[float]) -> tuple[float, float]:
    if any(math.isinf(v) for v in values):
        return math.inf, 0.0
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def analyse(table: dict) -> dict:
    """Per parametrization and width: the best LR, the seeds' own best LRs, its loss, and the
    transfer of the narrowest width's best LR to the widest."""
    out = {}
    for name, widths in table.items():
        rows = {}
        for width, by_lr in sorted(widths.items()):
            means = {lr: _mean_std(list(seeds.values())) for lr, seeds in by_lr.items()}
            best = min(means, key=lambda lr: means[lr][0])
            seeds = sorted({s for by_seed in by_lr.values() for s in by_seed})
            own = [min(by_lr, key=lambda lr, s=s: by_lr[lr].get(s, math.inf)) for s in seeds]
            rows[width] = {"best": best, "seed_best": own, "means": means}
        narrow, wide = min(rows), max(rows)
        chosen = rows[narrow]["best"]
        out[name] = {
            "rows": rows,
            "transfer": {
                "narrow": narrow,
                "wide": wide,
                "chosen": chosen,
                "at_chosen": rows[wide]["means"].get(chosen, (math.nan, 0.0)),
                "own_best": rows[wide]["best"],
                "at_own_best": rows[wide]["means"][rows[wide]["best"]],
            },
        }
    return out


def _loss(mean_std: tuple[float, float]) -> str:
    mean, std = mean_std
    return "diverged" if math.isinf(mean) else f"{mean:.3f} ± {std:.3f}"


def markdown(result: dict) -> str:
    """The two tables of docs/results.md's transfer section."""
    lines = [
        "| parametrization | width | best LR | seeds' own best LRs | val loss at the best LR |",
        "|---|---|---|---|---|",
    ]
    for name, part in result.items():
        for width, row in part["rows"].items():
            own = ", ".join(f"{lr:.2g}" for lr in row["seed_best"])
            best = row["best"]
            lines.append(f"| {name} | {width} | {best:.2g} | {own} | {_loss(row['means'][best])} |")
    lines += [
        "",
        "| parametrization | LR chosen at width | widest width's loss at it | "
        "its own best LR | loss there | gap |",
        "|---|---|---|---|---|---|",
    ]
    for name, part in result.items():
        t = part["transfer"]
        gap = t["at_chosen"][0] - t["at_own_best"][0]
        lines.append(
            f"| {name} | {t['chosen']:.2g} at {t['narrow']} | {_loss(t['at_chosen'])} at "
            f"{t['wide']} | {t['own_best']:.2g} | {_loss(t['at_own_best'])} | {gap:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def draw(result: dict, path: pathlib.Path) -> pathlib.Path:
    """Final val loss against the learning rate, one curve per width (error bars: the seeds'
    std), one panel per parametrization; diverged points left out."""
    fig = canvas.new_figure(10.0, 4.0)
    axes = fig.subplots(1, len(result), sharey=True, squeeze=False)[0]
    for ax, (name, part) in zip(axes, result.items(), strict=True):
        for width, row in part["rows"].items():
            points = sorted((lr, m) for lr, m in row["means"].items() if math.isfinite(m[0]))
            ax.errorbar(
                [p[0] for p in points],
                [p[1][0] for p in points],
                yerr=[p[1][1] for p in points],
                marker="o",
                capsize=2,
                label=f"width {width}",
            )
        ax.set_xscale("log")
        ax.set_title("μP (base width 64)" if name == "mup" else name)
        ax.set_xlabel("Adam learning rate")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final val loss (nats/char)")
    axes[-1].legend()
    fig.tight_layout()
    return canvas.save(fig, path)


def main(argv):
    del argv
    result = analyse(collect(*(pathlib.Path(d) for d in FLAGS.sweep_dir)))
    print(markdown(result), end="")
    if FLAGS.out:
        print(draw(result, pathlib.Path(FLAGS.out)))


if __name__ == "__main__":
    flags.DEFINE_list("sweep_dir", None, "The sweeps' directories, ROOT/SWEEP.", required=True)
    flags.DEFINE_string("out", "", "Where to write the picture (PNG); empty: no picture.")
    cli.main(main)
