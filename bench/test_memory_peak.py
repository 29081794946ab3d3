"""bench/memory_peak.py's reading of the CUDA allocator's trace, on a trace written by hand (the
script itself needs a GPU)."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import memory_peak

OP = [{"filename": "/x/torch/_ops.py", "line": 1, "name": "__call__"},
      {"filename": "/src/evidential_ops/triton_backend/launch.py", "line": 480, "name": "_strip_statistics"}]
GRAD = [{"filename": "/x/torch/autograd/graph.py", "line": 9, "name": "_engine_run_backward"}]


def event(action, addr, size, frames=()):
    return {"action": action, "addr": addr, "size": size, "frames": list(frames)}


def test_the_live_set_at_the_peak_and_its_call_sites():
    trace = [
        event("free_requested", 900, 64),          # a block from before the trace: its bytes count,
        event("free_completed", 900, 64),          # the block itself is unknown
        event("alloc", 1, 1000, OP),
        event("alloc", 2, 500, OP),
        event("alloc", 3, 200, GRAD),              # 1636
        event("free_requested", 1, 1000, OP),      # the allocated count drops at the request: 636,
        event("alloc", 4, 900, GRAD),              # 1536
        event("free_completed", 1, 1000, OP),      # not again at the completion,
        event("alloc", 5, 400, GRAD),              # so 1936, the peak (536 had it dropped twice)
    ]
    peak, blocks = memory_peak.live_at_peak(trace)
    assert peak == 1000 + 500 + 200 + 900 + 400 - 1000 - 64
    assert sorted(b["addr"] for b in blocks) == [2, 3, 4, 5]
    groups = memory_peak.grouped(blocks)
    assert groups[0] == {"site": "graph.py:9 _engine_run_backward", "blocks": 3, "bytes": 1500}
    assert groups[1] == {"site": "evidential_ops/triton_backend/launch.py:480 _strip_statistics", "blocks": 1,
                         "bytes": 500}
    assert memory_peak.call_site([]) == "(no frames)"
