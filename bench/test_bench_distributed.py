"""Smoke run of bench/distributed_bench.py (2 gloo processes, small K): it runs, its distributed
loss matches the single-process one, and the bytes it measures are the formula's."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import distributed_bench

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")


def test_distributed_bench_smoke(tmp_path):
    out = tmp_path / "distributed"
    assert distributed_bench.main(["--k-global", "192", "--dim", "32", "--repeats", "1", "--cases", "tcl",
                                   "--out", str(out), "--timeout", "300"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    (row,) = result["rows"]
    assert row["sizes"] == [96, 96] and row["loss_same_on_every_rank"]
    assert row["loss_rel_error"] <= 1e-5 and row["dx_rel_error"] <= 1e-4 and row["dy_rel_error"] <= 1e-4
    assert row["bytes_per_rank"] == row["bytes_formula"]
    assert "| tcl | 192 | 32 |" in out.with_suffix(".md").read_text()
