"""Smoke test of bench/device_bench.py (the GPU table's harness) on the CPU with a tiny size: every
implementation is timed, records and tables are written, and nothing errors."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import device_bench


def test_device_bench_writes_json_and_markdown(tmp_path):
    assert device_bench.main(["--device", "cpu", "--sizes", "48", "--d", "16", "--repeats", "1",
                              "--precisions", "ieee", "bf16", "--cases", "tcl", "--out", str(tmp_path),
                              "--name", "smoke"]) == 0
    payload = json.loads((tmp_path / "smoke.json").read_text())
    records = payload["records"]
    impls = {r["impl"] for r in records}
    assert {"reference", "compiled", "floor"} <= impls
    assert all("median_s" in r and "error" not in r for r in records), records
    assert len(records) == 2 * len(impls)
    table = (tmp_path / "smoke.md").read_text()
    assert "### ieee" in table and "### bf16" in table and payload["device"] in table
