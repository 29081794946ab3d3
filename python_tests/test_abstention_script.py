"""scripts/abstention.py (the source of bench/results/abstention.*) on small data."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from models_fixtures import single_thread

_one_thread = pytest.fixture(autouse=True)(single_thread)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "abstention.py"
# 60 test images: 30-query calibration halves keep 22 queries to test, the fewest α = δ = 0.1 allows.
SMALL = ["--epochs", "1", "--n-train", "40", "--n-test", "60", "--n-ood", "6"]


def _script():
    spec = importlib.util.spec_from_file_location("abstention_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_writes_the_results_and_the_tables(tmp_path):
    script = _script()
    assert script.main(["--seeds", "0", "1", "--out", str(tmp_path / "runs"), "--results", str(tmp_path), *SMALL]) == 0
    results = json.loads((tmp_path / "abstention.json").read_text())
    assert results["seeds"] == [0, 1] and (results["alpha"], results["delta"]) == (0.1, 0.1)
    runs = results["runs"]["tcl"]
    assert len(runs) == 2 and set(results["runs"]) == set(script.METHODS)
    coverage = [r["method"]["t2i"]["scores"]["u"]["coverage"] for r in runs]
    assert results["means"]["tcl"]["method"]["t2i"]["scores"]["u"]["coverage"] == pytest.approx(sum(coverage) / 2)
    assert "neg_top_probability" in results["means"]["tcl"]["infonce"]["t2i"]["scores"]
    table = (tmp_path / "abstention.md").read_text()
    for header in ("#### TCL", "#### TcVSE", "#### UML", "#### FUME", "#### DUQ",
                   "#### Which score answers the most queries at the guaranteed error"):
        assert header in table, header
    (tmp_path / "abstention.md").unlink()
    assert script.main(["--markdown-from", str(tmp_path / "abstention.json")]) == 0
    assert (tmp_path / "abstention.md").read_text() == table


def test_a_partial_run_never_overwrites_the_committed_results():
    with pytest.raises(SystemExit):
        _script().main(["--only", "tcl", "--results", str(SCRIPT.parents[1] / "bench" / "results")])
