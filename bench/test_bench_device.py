"""Smoke test of bench/device_bench.py (the GPU table's harness) on the CPU with a tiny size: every
implementation is timed, records and tables are written, and nothing errors."""

from __future__ import annotations

import json
import pathlib
import sys

import torch

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


def test_each_gpu_step_walks_every_combination_with_inputs_made_once_a_precision():
    """The loop bench/kernel_times.py and bench/memory_peak.py share (on the CPU here)."""
    seen = []
    for precision, case, backend, step, inputs in device_bench.each_gpu_step(["ieee", "bf16"], ["tcl"],
                                                                             ["cpu", "floor"], 8, 4, "cpu"):
        step(*inputs)
        seen.append((precision, case, backend, inputs[0].dtype, id(inputs)))
    assert [s[:4] for s in seen] == [("ieee", "tcl", "cpu", torch.float32), ("ieee", "tcl", "floor", torch.float32),
                                     ("bf16", "tcl", "cpu", torch.bfloat16), ("bf16", "tcl", "floor", torch.bfloat16)]
    assert seen[0][4] == seen[1][4]  # one pair of inputs for a precision's steps
