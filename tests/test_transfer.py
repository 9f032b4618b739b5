"""experiments/transfer.py: the best learning rate per width and the transfer gap, from a
stand-in sweep directory with literal losses."""

import json

import pytest

from experiments import transfer

# (parametrization, width, lr, seed) -> final eval loss; width 64's best LR is 0.01 under both.
LOSSES = {
    ("standard", 64, 0.001, 0): 2.0,
    ("standard", 64, 0.001, 1): 2.2,
    ("standard", 64, 0.01, 0): 1.5,
    ("standard", 64, 0.01, 1): 1.7,
    ("standard", 256, 0.001, 0): 1.4,
    ("standard", 256, 0.001, 1): 1.4,
    ("standard", 256, 0.01, 0): float("nan"),  # diverged
    ("standard", 256, 0.01, 1): 1.9,
    ("mup", 64, 0.001, 0): 2.0,
    ("mup", 64, 0.001, 1): 2.2,
    ("mup", 64, 0.01, 0): 1.5,
    ("mup", 64, 0.01, 1): 1.7,
    ("mup", 256, 0.001, 0): 1.6,
    ("mup", 256, 0.001, 1): 1.2,  # seed 1's own best
    ("mup", 256, 0.01, 0): 1.3,
    ("mup", 256, 0.01, 1): 1.3,
}


@pytest.fixture
def sweep_dir(tmp_path):
    for (name, width, lr, seed), loss in LOSSES.items():
        run = tmp_path / f"{name}-{width}-{lr}-{seed}"
        run.mkdir()
        config = {
            "model": {"parametrization": name, "embed_dim": width},
            "optim": {"learning_rate": lr},
            "seed": seed,
        }
        (run / "config.json").write_text(json.dumps(config))
        record = {"step": 10, "kind": "final_eval", "loss": loss}
        (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "_vectorized-0").mkdir()  # a group's directory: not a trial
    return tmp_path


def test_best_learning_rates_and_the_transfer_gap(sweep_dir):
    result = transfer.analyse(transfer.collect(sweep_dir))
    mup, standard = result["mup"], result["standard"]
    assert mup["rows"][256]["best"] == 0.01 and mup["rows"][256]["seed_best"] == [0.01, 0.001]
    assert standard["rows"][256]["best"] == 0.001  # 0.01 diverged for one seed: infinite
    assert standard["transfer"]["at_chosen"][0] == float("inf")
    t = mup["transfer"]
    assert (t["narrow"], t["wide"], t["chosen"], t["own_best"]) == (64, 256, 0.01, 0.01)
    assert t["at_chosen"] == pytest.approx((1.3, 0.0))
    text = transfer.markdown(result)
    assert "| mup | 0.01 at 64 | 1.300 ± 0.000 at 256 | 0.01 | 1.300 ± 0.000 | +0.000 |" in text
    assert "| standard | 0.01 at 64 | diverged at 256 | 0.001 | 1.400 ± 0.000 | +inf |" in text
