"""torch.compile's view of the Triton kernels, without a GPU.

Under torch.compile every launch becomes a triton_kernel_wrapper HOP, and torch builds the kernel's
TTIR to find which tensor arguments it writes (`identify_mutated_tensors` in torch 2.11,
`identify_accessed_tensors` later). Where that raises, torch logs a warning and takes every tensor
argument as written: the op inputs x and y then look mutated in place, and AOTAutograd fails with
"a leaf Variable that requires grad is being used in an in-place operation" (the first H200 run).
Inductor also drops every constexpr from a user kernel's call and keeps one that was not passed
(a defaulted one) in its launcher's parameters: `launcher() missing 1 required positional argument:
'_grid_2'`.

The launches are recorded here, in the interpreter, from the ops themselves (eagerly, and as in a
traced graph: device weights, no host reads, the fused backward); a subprocess without the
interpreter runs torch's analysis on each for GPUTarget("cuda", 90, 32), with the installed triton
and with the GPU's (build/triton-3.6.0, `make triton-aot-check` installs it).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import evidential_ops as eo

pytestmark = pytest.mark.skipif("triton" not in eo.available_backends(),
                                reason=f"triton backend not available: {eo.triton_backend.UNAVAILABLE}")
ROOT = pathlib.Path(__file__).resolve().parents[1]
SPECIAL = ("num_warps", "num_stages", "num_ctas")


def _record_launches(monkeypatch) -> list[dict]:
    from evidential_ops.triton_backend import configs, infonce_launch, launch

    records, inputs = [], {}
    real = launch._launch

    def describe(a):
        if isinstance(a, torch.Tensor):
            ptr = a.untyped_storage().data_ptr()
            return {"dtype": str(a.dtype).removeprefix("torch."), "inputs": [n for n, p in inputs.items() if p == ptr]}
        return a

    def recording(kernel, grid, *args, **meta):
        fn = getattr(kernel, "fn", kernel)
        records.append({"kernel": fn.__name__, "module": fn.__module__, "args": [describe(a) for a in args],
                        "meta": {k: describe(v) for k, v in meta.items()}})
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(launch, "_launch", recording)
    monkeypatch.setattr(infonce_launch, "_launch", recording)

    def op(fn, names, *args):
        inputs.clear()
        inputs.update({n: a.untyped_storage().data_ptr() for n, a in zip(names, args) if isinstance(a, torch.Tensor)})
        try:
            return fn(*args)
        except ValueError:  # a value check after the launches (the interpreter's 16-bit inputs overflow)
            return None

    fwd = ["x", "y", "target_scale", "evidence", "tau", "weights", "terms", "rows", "cols", "precision"]
    bwd = ["grad_rows", "grad_cols", "x", "y", "target_scale", "row_stats", "col_stats", "evidence", "tau", "weights",
           "terms", "rows", "cols", "target_offset", "output_mask", "precision"]
    g = torch.Generator().manual_seed(0)
    k = 8
    w = torch.tensor([1.0, 0.1, 0.5, 0.7, -0.01], dtype=torch.float64)
    up = torch.ones(k)
    for traced in (False, True):
        if traced:  # as inside a graph: weights from the device (W_FROM_PTR), no strips of s, the fused backward
            monkeypatch.setattr(launch, "_tracing", lambda t: True)
            monkeypatch.setattr(configs, "has_default", lambda name, device: True)
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            x, y = (torch.nn.functional.normalize(torch.randn(k, 16, generator=g), dim=1).to(dtype) for _ in "xy")
            ts = torch.rand(k, generator=g, dtype=torch.float64)
            op(launch.loss_forward, fwd, x, y, ts, "exp", 0.05, w, 31, True, True, "ieee")
            _, _, rs, cs = launch.loss_forward(x.float(), y.float(), ts, "exp", 0.05, w, 31, True, True, "ieee")
            for mask in ([True, True], [True, False]):
                op(launch.loss_backward, bwd, up, up, x, y, ts, rs, cs, "exp", 0.05, w, 31, True, True, 0, mask, "ieee")
            s = (x.float() @ y.float().t()).to(dtype)
            op(launch.loss_forward_from_similarity, ["s", *fwd[2:9]], s, None, "relu", 0.05, w, 31, True, True)
            op(launch.loss_backward_from_similarity, ["grad_rows", "grad_cols", "s", *bwd[4:13]], up, up, s, None,
               rs, cs, "relu", 0.05, w, 31, True, True)
            op(launch.opinion, ["x", "y", "evidence", "tau", "precision"], x, y, "exp_tanh", 0.05, "ieee")
            op(launch.line_stats, ["x", "y", "target_offset", "evidence", "tau", "terms", "rows", "cols", "precision"],
               x[:3], y, 2, "softplus", 0.05, 31, True, True, "ieee")
            op(launch.line_losses, ["row_stats", "col_stats", "target_scale", "target_offset", "weights", "terms",
                                    "rows", "cols"], rs[:, :3].contiguous(), cs, ts, 2, w, 31, True, True)
            for group, d in ((None, 16), (torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), 300)):
                xi, yi = (torch.nn.functional.normalize(torch.randn(k, d, generator=g), dim=1).to(dtype) for _ in "xy")
                names = ["x", "y", "group", "tau", "drop_self", "rows", "cols"]
                op(infonce_launch.infonce_forward, names, xi, yi, group, 0.07, group is not None, True, True)
                out = infonce_launch.infonce_forward(xi.float(), yi.float(), group, 0.07, group is not None, True, True)
                op(infonce_launch.infonce_backward, ["grad_rows", "grad_cols", *names[:3], "row_stats", "col_stats",
                                                     *names[3:], "output_mask"],
                   up, up, xi, yi, group, out[2], out[3], 0.07, group is not None, True, True, [True, True])
    return records


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    from evidential_ops.triton_backend import configs

    if not configs.interpreting():
        pytest.skip("the launches are recorded in the interpreter (TRITON_INTERPRET=1)")
    with pytest.MonkeyPatch.context() as monkeypatch:
        records = _record_launches(monkeypatch)
    path = tmp_path_factory.mktemp("launches") / "launches.json"
    path.write_text(json.dumps(records))
    return records, path


def test_every_launch_passes_every_kernel_argument(launches):
    """Inductor's launcher keeps a constexpr that was not passed (a default) among its parameters but
    its call drops every constexpr: `launcher() missing 1 required positional argument: '_grid_2'`
    (reduce_partials_kernel's CLEAR on the H200); torch's TTIR analysis rejects such a launch too."""
    from evidential_ops.triton_backend import infonce_kernels, kernels

    missing = set()
    for r in launches[0]:
        fn = getattr(kernels, r["kernel"], None) or getattr(infonce_kernels, r["kernel"])
        passed = fn.arg_names[:len(r["args"])] + [k for k in r["meta"] if k not in SPECIAL]
        missing |= {(r["kernel"], name) for name in fn.arg_names if name not in passed}
    assert not missing, f"launches leave these kernel parameters to their defaults: {sorted(missing)}"


PROBE = r'''
import json, logging, os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, sys.argv[1])
import torch, triton
from triton.backends.compiler import GPUTarget
import torch._higher_order_ops.triton_kernel_wrap as tkw
from evidential_ops.triton_backend import infonce_kernels, kernels

class Sm90:  # generate_ttir asks the active driver for its target; there is no GPU here
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)
triton.runtime.driver.set_active(Sm90())
failures = []
class Catch(logging.Handler):
    def emit(self, record):
        if record.exc_info:
            failures.append(f"{type(record.exc_info[1]).__name__}: {str(record.exc_info[1]).strip().splitlines()[-1]}")
tkw.log.addHandler(Catch())
tkw.log.propagate = False
analyse = getattr(tkw, "identify_accessed_tensors", None) or tkw.identify_mutated_tensors
seen = set()
for r in json.load(open(sys.argv[2])):
    fn = getattr(kernels, r["kernel"], None) or getattr(infonce_kernels, r["kernel"])
    inputs, kwargs = {}, {}
    for name, a in [*zip(fn.arg_names, r["args"]), *r["meta"].items()]:
        if name in ("num_warps", "num_stages", "num_ctas"):
            continue
        if isinstance(a, dict):
            kwargs[name] = torch.empty(4, dtype=getattr(torch, a["dtype"]))
            if a["inputs"]:
                inputs[name] = a["inputs"]
        else:
            kwargs[name] = a
    key = json.dumps([r["kernel"], {k: (str(v.dtype) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()
                                    if k in r["meta"] or isinstance(v, torch.Tensor) or v == 1}, inputs], sort_keys=True)
    if key in seen:
        continue
    seen.add(key)
    del failures[:]
    result = analyse(fn, kwargs, {})
    written = result if isinstance(result, list) else [d.name for d in result.read_writes.writes]
    meta = {k: v for k, v in r["meta"].items() if not isinstance(v, dict)}
    for failure in failures:
        print(json.dumps([r["kernel"], meta, "analysis failed: " + failure]))
    if not failures:
        for name in written:
            if name in inputs:
                print(json.dumps([r["kernel"], meta, f"writes {name}, which is the op input {inputs[name]}"]))
'''


def _triton_installs():
    installs = [None]
    gpu = ROOT / "build" / "triton-3.6.0"  # the GPU's triton (Makefile TRITON_GPU_DIR)
    if (gpu / "triton").is_dir():
        installs.append(str(gpu))
    return installs


@pytest.mark.parametrize("triton_path", _triton_installs(), ids=lambda p: "installed" if p is None else "3.6.0")
def test_torch_compile_analyses_every_launch(launches, triton_path, tmp_path):
    """Every launch of the ops passes torch.compile's mutation analysis (its TTIR builds: on the H200
    grad_block_kernel's `inv_tau` rebound inside a branch, and reduce_partials_kernel's defaulted
    CLEAR, made it fall back to "every tensor written"), and no kernel writes a pointer that holds
    an op input (x, y, s, statistics, weights passed as a placeholder)."""
    pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [triton_path, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(script), str(ROOT), str(launches[1])], capture_output=True, text=True,
                         env=env, timeout=900)
    if run.returncode != 0 and "ModuleNotFoundError" in run.stderr:
        pytest.skip(f"cannot analyse here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    problems = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
    assert not problems, "\n".join(map(str, problems[:20]))
