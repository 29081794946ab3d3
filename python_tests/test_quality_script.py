"""scripts/uncertainty_quality.py (the source of the tables of docs/uncertainty_quality.md) on tiny data."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from models_fixtures import single_thread

_one_thread = pytest.fixture(autouse=True)(single_thread)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "uncertainty_quality.py"
TINY = ["--epochs", "1", "--n-train", "40", "--n-val", "4", "--n-test", "10", "--n-ood", "6"]


def _script():
    spec = importlib.util.spec_from_file_location("uncertainty_quality_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_writes_the_results_and_the_tables(tmp_path, capsys):
    script = _script()
    assert script.main(["--seeds", "0", "1", "--out", str(tmp_path / "runs"), "--results", str(tmp_path), *TINY]) == 0
    results = json.loads((tmp_path / "uncertainty_quality.json").read_text())
    assert results["seeds"] == [0, 1] and "--seeds 0 1" in results["command"]
    assert set(results["runs"]) == set(script.METHODS) | set(script.VARIANTS)
    runs = results["runs"]["tcl"]
    assert len(runs) == 2
    # The means are the means of the per-seed figures.
    mean = results["means"]["tcl"]
    assert mean["rsum"] == pytest.approx((runs[0]["rsum"] + runs[1]["rsum"]) / 2)
    u = [r["quality"]["t2i"]["scores"]["u"]["aurc"] for r in runs]
    assert mean["quality"]["t2i"]["scores"]["u"]["aurc"] == pytest.approx(sum(u) / 2)
    assert results["means"]["uml_exp_tau0.1"]["audit"]["uncertainty_auroc_noisy"] is not None
    table = (tmp_path / "uncertainty_quality.md").read_text()
    for header in ("#### TCL", "#### TcVSE", "#### UML", "#### FUME", "#### DUQ", "#### Variants"):
        assert header in table
    assert "baseline: −top-1 similarity" in table and "InfoNCE baseline: −softmax confidence" in table
    assert "s′, `printed`" in table and "1 − D alone (min rule for every pair)" in table
    assert "InfoNCE baseline: −top-1 similarity" in table
    assert "InfoNCE baseline: −softmax summed over the top-1's class" in table  # beside FUME (by class)
    assert "tcl seed 1: rsum" in capsys.readouterr().out
    # The machine is named, and every model row gives the seeds' min–max beside the mean.
    assert results["machine"]["cpu"] and "Machine: " in table
    low, high = sorted(r["rsum"] for r in runs)
    assert f"{mean['rsum']:.1f} ({low:.1f}–{high:.1f})" in table
    ahead = sum(r["rsum"] > r["infonce"]["rsum"] for r in runs)
    tcl_summary = next(line for line in table.split("#### TCL")[0].splitlines() if line.startswith("| TCL |"))
    assert f"| {ahead} of 2 seeds |" in tcl_summary
    # The tables are a function of the saved figures: --tables-from rewrites them identically.
    (tmp_path / "uncertainty_quality.md").unlink()
    assert script.main(["--tables-from", str(tmp_path / "uncertainty_quality.json")]) == 0
    assert (tmp_path / "uncertainty_quality.md").read_text() == table


def test_smoke_runs_never_overwrite_the_committed_results(tmp_path, monkeypatch):
    script = _script()
    committed = script.COMMITTED_RESULTS / "uncertainty_quality.json"
    before = committed.read_bytes() if committed.exists() else None
    for partial in (["--only", "tcl"], ["--epochs", "1"], ["--n-test", "10"]):
        with pytest.raises(SystemExit):
            script.main(["--results", str(script.COMMITTED_RESULTS), "--out", str(tmp_path), *partial])
    assert (committed.read_bytes() if committed.exists() else None) == before
    # Without --results the figures go to the run directory.
    assert script.main(["--seeds", "0", "--only", "fume", "--out", str(tmp_path / "runs"), *TINY]) == 0
    assert (tmp_path / "runs" / "uncertainty_quality.json").exists()


def test_script_rejects_unknown_runs(tmp_path):
    with pytest.raises(SystemExit):
        _script().main(["--only", "clip", "--results", str(tmp_path)])
