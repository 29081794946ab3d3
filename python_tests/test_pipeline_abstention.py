"""Calibrated abstention in the pipelines: the split experiment, the report, the demo's output and
the `abstain` subcommand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from models_fixtures import single_thread

from evidential_ops.__main__ import main
from evidential_ops.pipelines import abstention

_one_thread = pytest.fixture(autouse=True)(single_thread)

TINY = ["--n-train", "40", "--n-val", "4", "--n-test", "10", "--n-ood", "6", "--epochs", "1",
        "--batch-size", "16", "--embed-dim", "16", "--quiet"]


def _synthetic(n: int, seed: int, informative: bool = True):
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    wrong = rng.random(n) < ((0.01 + 0.4 * u ** 2) if informative else np.full(n, 0.3))
    return u, wrong


def test_split_experiment_holds_the_guarantee_and_answers():
    u, wrong = _synthetic(2000, 0)
    ood = np.random.default_rng(1).random(300) * 0.2  # shifted queries that look certain
    r = abstention.split_experiment(u, wrong, n_splits=100, ood_scores=ood)
    assert r["validity"] >= 0.9 - 3.5 * (0.09 / 100) ** 0.5
    assert 0.0 <= r["held_out_validity"] <= 1.0  # reported, not guaranteed
    assert 0.3 < r["coverage"] < 0.9 and r["error"] <= 0.1 and r["certified"] > 0.9
    # The counterexample: OOD queries that look certain are answered, and every one is wrong.
    assert r["ood_answered"] > 0.9
    assert r["mixed_error"] > 0.1 and r["mixed_validity"] < 0.5


def test_split_experiment_says_when_there_are_too_few_queries():
    u, wrong = _synthetic(40, 0)
    r = abstention.split_experiment(u, wrong, n_splits=5)
    assert r["validity"] is None and r["coverage"] is None and "needed" in r["too_few_queries"]


def test_report_picks_the_score_that_answers_most():
    u, wrong = _synthetic(1500, 2)
    noise = np.random.default_rng(3).random(1500)
    raw = {"t2i": {"scores": {"good": torch.from_numpy(u), "useless": torch.from_numpy(noise)},
                   "wrong": torch.from_numpy(wrong), "baselines": ["useless"], "ood_scores": None}}
    report, curves = abstention.abstention_report(raw, n_splits=40)
    rows = report["t2i"]["scores"]
    assert report["t2i"]["most_answered"] == "good"
    assert rows["good"]["coverage"] > rows["useless"]["coverage"]
    assert 0 < rows["good"]["hindsight_coverage"] <= 1
    assert set(rows["good"]["coverage_by_alpha"]) == {f"{a:g}" for a in abstention.ALPHA_GRID}
    assert curves["t2i"]["good"]["alpha"] == list(abstention.ALPHA_GRID)
    text = "\n".join(abstention.abstention_lines(report, "toy"))
    assert "most answered at the guaranteed error: good" in text and "useless (baseline)" in text


def test_demo_reports_abstention_and_plots_coverage(tmp_path, capsys):
    assert main(["demo", "--method", "tcl", "--out", str(tmp_path), "--no-bench", *TINY]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    block = metrics["abstention"]
    assert (block["alpha"], block["delta"], block["n_splits"]) == (0.1, 0.1, 200)
    for direction in ("i2t", "t2i"):
        assert {"u", "neg_top_belief", "neg_top1_similarity"} <= set(block[direction]["scores"])
    assert "neg_top_probability" in metrics["infonce_baseline"]["abstention"]["t2i"]["scores"]
    assert (tmp_path / "abstention_coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "abstention of tcl at α = 0.1" in capsys.readouterr().out


def test_abstain_subcommand_calibrates_and_answers(tmp_path, capsys):
    sizes = ["--n-train", "40", "--n-val", "4", "--n-test", "60", "--n-ood", "6", "--epochs", "1",
             "--batch-size", "16", "--embed-dim", "16", "--quiet"]
    assert main(["train", "--method", "tcl", "--out", str(tmp_path), "--baseline", *sizes]) == 0
    capsys.readouterr()
    assert main(["abstain", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--score", "neg_top1_similarity",
                 "--direction", "t2i", "--alpha", "0.5", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "guarantee:" in out and "held-out test queries" in out
    result = json.loads((tmp_path / "abstain_t2i_neg_top1_similarity.json").read_text())
    held = result["held_out"]
    assert held["n_queries"] == 150 and len(held["answers"]) == 150
    assert held["answered"] == sum(a["answer"] is not None for a in held["answers"])
    assert result["calibration"]["n_calibration"] == 150 and result["ood"]["n_queries"] == 30
    assert main(["abstain", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--score", "neg_top_probability",
                 "--baseline", "--out", str(tmp_path)]) == 0
    with pytest.raises(SystemExit, match="abstain: score 'nope' is not one of tcl's t2i scores"):
        main(["abstain", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--score", "nope"])
    with pytest.raises(SystemExit):
        main(["abstain", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--score", "u", "--alpha", "1.5"])
