"""bench/gpu_model.py: the floor and term arithmetic against hand-computed values, the strip-plan
port against the header compiled, ceilings files, and the CLI on a synthetic static profile (no
compiler needed: fast)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_model as gm  # noqa: E402
import static_profile as sp  # noqa: E402

H100 = gm.load_ceilings("h100-sxm")


def fake_profile() -> dict:
    """A static profile with every row the model reads: 100 instructions per element, 40 of them
    FP32 and 8 MUFU (cuda forward: 256 so that the issue pipe binds at 2 cycles)."""
    rows = []
    for backend, per_iteration in (("cuda", 1), ("triton", 2.0)):
        for method in sp.METHODS:
            for direction in ("fwd", "bwd"):
                total = 256 if (backend, direction) == ("cuda", "fwd") else 100
                own = dict(total=total, fp64=0, fp32=40, mufu=8, int=20, conv=0, mem=4, tensor=0, control=10,
                           other=total - 82, dmul_dfma=0)
                rows.append(dict(backend=backend, method=method, direction=direction,
                                 elements_per_iteration=per_iteration,
                                 hot=dict(own={k: v * per_iteration for k, v in own.items()}),
                                 resources=dict(registers=64)))
    return dict(header=dict(nvcc="test", triton="test", arch="sm_90", commit="test"), rows=rows)


def test_floor_matches_hand_computation():
    # bf16, K = 4096, D = 512 on the H100 datasheet: each product 2·4096²·512 = 17.18 GFLOP at
    # 989.4 TFLOP/s = 17.365 µs; its bytes (s = x·yᵀ: 2·4096·512·2 + 4096²·2 = 41.94 MB at
    # 3.35 TB/s = 12.52 µs) are hidden; 3 launches × 3 µs.
    t = gm.step_time(gm.floor_step("bf16", 4096, 512), H100, "bf16")
    assert t["gemm"] == pytest.approx(3 * 2 * 4096**2 * 512 / 989.4e12)
    assert t["gemm"] == pytest.approx(52.09e-6, rel=1e-3)
    assert t["dram"] == pytest.approx((2 * 4096 * 512 * 2 + 4096**2 * 2 + 2 * (4096**2 * 2 + 4096 * 512 * 2
                                       + 4096 * 512 * 2)) / 3.35e12)
    assert t["total"] == pytest.approx(52.09e-6 + 9e-6, rel=1e-3)
    assert t["largest"] == "gemm"
    # ieee runs on the FP32 pipes: 67 TFLOP/s
    assert gm.step_time(gm.floor_step("ieee", 4096, 512), H100, "ieee")["gemm"] == \
        pytest.approx(3 * 2 * 4096**2 * 512 / 67e12)


def test_kernel_terms_and_binding():
    k = gm.Kernel("forward", "k", launches=2, flops=989.4e9, elements=132 * 1.98e9, cycles_per_element=1.0,
                  dram={"a": 3.35e9}, l2={"b": 7.0e12 * 5}, fill=0.5, syncs=1)
    t = k.terms(H100, "bf16")
    assert t["gemm"] == pytest.approx(1e-3)
    assert t["element"] == pytest.approx(1.0)
    assert t["dram"] == pytest.approx(2e-3)        # half the SMs: half the bandwidth
    assert t["l2"] == pytest.approx(10.0)
    assert t["total"] == pytest.approx(10.0 + 6e-6 + 20e-6)
    assert t["bound"] == "l2"


def test_step_terms_add_up():
    profile = fake_profile()
    for backend in ("cuda", "triton"):
        row = gm.predict(backend, "tcl", "bf16", 4096, 512, H100, profile)
        assert row["predicted_s"] == pytest.approx(sum(k["seconds"]["total"] for k in row["kernels"]))
        for term in gm.TERM_NAMES:
            assert row["terms_s"][term] == pytest.approx(sum(k["seconds"][term] for k in row["kernels"]))
        for k in row["kernels"]:
            s = k["seconds"]
            assert s["total"] == pytest.approx(max(s["gemm"] + s["element"], s["dram"], s["l2"]) + s["launch"]
                                               + s["sync"])
        assert row["largest"] == max(gm.TERM_NAMES, key=lambda n: row["terms_s"][n])
        assert row["ratio"] == pytest.approx(row["predicted_s"] / row["floor_s"])


def test_pipe_cycles():
    cycles, pipe, every = gm.pipe_cycles(dict(total=256, fp32=40, mufu=8, int=20, mem=4), H100["rates"])
    assert (cycles, pipe) == (2.0, "issue")
    cycles, pipe, _ = gm.pipe_cycles(dict(total=100, fp32=10, mufu=48), H100["rates"])
    assert (cycles, pipe) == (3.0, "mufu")
    assert every["fp32"] == pytest.approx(40 / 128) and every["int"] == pytest.approx(20 / 64)


def test_cuda_step_counts_what_the_host_code_does():
    profile = fake_profile()
    row = gm.predict("cuda", "tcl", "bf16", 16384, 1024, H100, profile)
    plan = row["plans"]["backward"]
    names = [k["name"] for k in row["kernels"]]
    gemms = sum(k["flops"] for k in row["kernels"])
    assert gemms == pytest.approx(8 * 16384**2 * 1024)  # s twice (the backward recomputes it), dx, dy
    dy = next(k for k in row["kernels"] if k["name"].startswith("dy GEMM"))
    # 2-D blocks: dy's float32 accumulator read and written once per row block (6, not 25 strips),
    # dx[r] in float32 read and written once per column block and cast once per row block
    assert (plan["row_blocks"], plan["col_blocks"]) == (6, 6)
    assert dy["dram_bytes"]["dy accumulator read-modify-write per row block (float32)"] == \
        plan["row_blocks"] * 16384 * 1024 * 4 * 2
    dx = next(k for k in row["kernels"] if k["name"].startswith("dx GEMM"))
    assert dx["dram_bytes"]["dx[r] read-modify-write per column block"] == 5 * 16384 * 1024 * 4 * 2
    assert "dy cast float32 → input dtype" in names
    assert next(k for k in row["kernels"] if k["name"].startswith("dx[r] cast"))["launches"] == 6
    # exp evidence: an overflow is possible for float32 products, and the unit-norm inputs' norm
    # bound (read ahead: x and y once, 6 launches) rules it out: no host read
    bound = next(k for k in row["kernels"] if k["name"].startswith("norm bound"))
    assert (bound["launches"], bound["dram_bytes"]["x and y read"]) == (6, 2 * 16384 * 1024 * 2)
    assert row["syncs"] == 0
    assert gm.predict("cuda", "uml", "bf16", 16384, 1024, H100, profile)["syncs"] == 0
    # at K = 65536 a forward strip has ~200 rows: reduce_partials takes a block per 32 rows and per
    # 256 columns, each per statistic slot (TCL: rest, kl, squares), in one launch per strip
    big = gm.predict("cuda", "tcl", "ieee", 65536, 1024, H100, profile)
    reduce = next(k for k in big["kernels"] if k["name"].startswith("reduce_partials"))
    rows = big["plans"]["forward"]["strip_rows"]
    assert reduce["fill"] == pytest.approx(min(1.0, (-(-rows // 32) + 65536 // 256) * 3 / 132))
    assert reduce["launches"] == big["plans"]["forward"]["strips"] > 100
    assert {"row partials read", "column partials read"} <= set(reduce["dram_bytes"])


def test_memory_targets_follow_the_buffers():
    profile = fake_profile()
    ieee = gm.predict("cuda", "tcl", "ieee", 65536, 1024, H100, profile)["memory"]
    bf16_row = gm.predict("cuda", "tcl", "bf16", 65536, 1024, H100, profile)
    bf16 = bf16_row["memory"]
    # bfloat16 at K·D·4 = 256 MiB > the 64 MiB budget: dy from the sᵀ sweep, written once in bfloat16,
    # no float32 accumulator; the workspace holds a bfloat16 ∂L/∂s strip besides the float32 s strip.
    assert bf16_row["plans"]["dy_by_columns"]
    assert "dy accumulator (float32)" not in bf16["items_mib"]
    assert ieee["beyond_grads_mib"] < 128 and bf16["beyond_grads_mib"] < 128
    # K = 16384: the accumulator (64 MiB) is within the budget and stays, with its cast (32 MiB)
    small_bf16 = gm.predict("cuda", "tcl", "bf16", 16384, 1024, H100, profile)
    assert not small_bf16["plans"]["dy_by_columns"]
    items = small_bf16["memory"]["items_mib"]
    assert items["dy accumulator (float32)"] == 64 and items["dy cast"] == 32


def test_cuda_dy_by_columns_adds_one_sweep():
    """Where dy takes the sᵀ sweep, the backward recomputes s twice (4 GEMMs + the forward's: 5 in all)
    and runs the element pass twice; nothing accumulates dy."""
    profile = fake_profile()
    row = gm.predict("cuda", "tcl", "bf16", 65536, 1024, H100, profile)
    gemms = sum(k["flops"] for k in row["kernels"])
    assert gemms == pytest.approx(10 * 65536**2 * 1024)
    names = [k["name"] for k in row["kernels"]]
    assert sum(name.startswith("gradient_kernel") for name in names) == 2
    assert "dy GEMM Gᵀ·x (per block)" not in names and "dy cast float32 → input dtype" not in names
    assert any(name.startswith("dy GEMM (∂L/∂sᵀ)·x") for name in names)


def test_strip_constants_are_read_from_the_header():
    k = gm.strip_constants()
    assert k["kThreads"] == 256 and k["kStatSlots"] == 6 and k["kDefaultWorkspaceMiB"] == 64


def printed_by_the_header(tmp_path, show: str, calls: list) -> list:
    """What a C++ program of strip_plan.h prints: `show` (a function printing one plan per line)
    called with each of `calls` (argument lists as C++ source)."""
    source = tmp_path / "plan.cpp"
    body = "\n".join(f"  show({call});" for call in calls)
    source.write_text('#include <cstdio>\n#include "cuda/strip_plan.h"\nnamespace sp = evidential_ops::cuda;\n'
                      f"{show}\nint main() {{\n{body}\n}}\n")
    binary = tmp_path / "plan"
    subprocess.run(["g++", "-std=c++17", f"-I{gm.ROOT}/csrc", str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return [[int(v) for v in line.split()] for line in out.splitlines()]


FLAG = {0: "false", 1: "true"}


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_plan_strips_port_matches_the_header(tmp_path):
    cases = [(16384, 16384, 4, 0, 1, 0, 64 << 20), (65536, 65536, 4, 0, 1, 0, 64 << 20),
             (65536, 65536, 4, 2, 0, 0, 64 << 20), (4096, 4096, 8, 0, 1, 0, 1 << 20), (1000, 3000, 4, 2, 0, 1, 12345),
             (7, 5, 0, 0, 1, 0, 64 << 20)]
    show = ("void show(long m, long n, sp::StripNeeds needs, long budget) {\n"
            "  auto p = sp::plan_strips(m, n, needs, budget);\n"
            '  std::printf("%lld %lld %lld %lld %lld\\n", (long long)p.strip_rows, (long long)p.strips, '
            "(long long)p.col_blocks, (long long)p.row_groups, (long long)p.total_bytes);\n}")
    calls = [f"{m}, {n}, sp::StripNeeds{{{t}, {h}, {FLAG[p]}, {FLAG[s]}}}, {b}" for m, n, t, h, p, s, b in cases]
    printed = printed_by_the_header(tmp_path, show, calls)
    for (m, n, t, h, p, s, b), line in zip(cases, printed, strict=True):
        plan = gm.plan_strips(m, n, t, h, bool(p), bool(s), b)
        assert [plan[k] for k in ("strip_rows", "strips", "col_blocks", "row_groups", "total_bytes")] == line, \
            (m, n, t, h, p, s, b)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_plan_gradient_blocks_port_matches_the_header(tmp_path):
    # (m, n, d, tile, half, scalars, accumulator, budget): cut and uncut rows, half and float
    cases = [(16384, 16384, 1024, 4, 2, 0, 4, 64 << 20), (65536, 65536, 1024, 4, 0, 0, 0, 64 << 20),
             (4096, 4096, 1024, 4, 2, 0, 4, 64 << 20), (65536, 65536, 1024, 4, 2, 1, 4, 64 << 20),
             (1000, 3000, 203, 8, 0, 0, 0, 12345), (1, 65536, 7, 4, 0, 0, 0, 65536), (7, 5, 3, 0, 0, 0, 0, 1)]
    show = ("void show(long m, long n, long d, sp::StripNeeds needs, long acc, long budget) {\n"
            "  auto p = sp::plan_gradient_blocks(m, n, d, needs, acc, budget);\n"
            '  std::printf("%lld %lld %lld %lld %lld\\n", (long long)p.block_rows, (long long)p.row_blocks, '
            "(long long)p.block_cols, (long long)p.col_blocks, (long long)p.total_bytes);\n}")
    calls = [f"{m}, {n}, {d}, sp::StripNeeds{{{t}, {h}, false, {FLAG[s]}}}, {a}, {b}"
             for m, n, d, t, h, s, a, b in cases]
    printed = printed_by_the_header(tmp_path, show, calls)
    for (m, n, d, t, h, s, a, b), line in zip(cases, printed, strict=True):
        plan = gm.plan_gradient_blocks(m, n, d, t, h, bool(s), a, b)
        assert [plan[k] for k in ("block_rows", "row_blocks", "block_cols", "col_blocks", "total_bytes")] == line, \
            (m, n, d, t, h, s, a, b)


def test_ceilings_file_overrides_the_datasheet(tmp_path):
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps(dict(device="test GPU", hbm_tbs=1.0, gemm_tflops=dict(bf16=100.0), launch_us=1.0)))
    c = gm.load_ceilings("h100-sxm", str(path))
    assert c["hbm_tbs"] == 1.0 and c["gemm_tflops"]["bf16"] == 100.0 and c["launch_us"] == 1.0
    assert c["gemm_tflops"]["tf32"] == gm.DEVICES["h100-sxm"]["gemm_tflops"]["tf32"]  # not measured: datasheet
    assert set(c["measured"]) == {"hbm_tbs", "gemm_tflops.bf16", "launch_us"}
    assert gm.DEVICES["h100-sxm"]["hbm_tbs"] == 3.35  # the table itself untouched
    floor = gm.step_time(gm.floor_step("bf16", 4096, 512), c, "bf16")
    assert floor["gemm"] == pytest.approx(3 * 2 * 4096**2 * 512 / 100e12)


def test_profile_is_reused_only_when_newer_than_the_sources(tmp_path, monkeypatch):
    path = tmp_path / "static_profile.json"
    path.write_text(json.dumps(fake_profile()))
    calls = []
    monkeypatch.setattr(gm.static_profile, "main", lambda argv: calls.append(argv) or 0)
    newer = gm._source_mtime() + 100
    os.utime(path, (newer, newer))
    assert gm.load_profile(refresh_to=str(path))["header"]["nvcc"] == "test" and not calls
    older = gm._source_mtime() - 100
    os.utime(path, (older, older))
    # stale: profiled again; the stub writes nothing, so there is no profile (as without a compiler)
    assert gm.load_profile(refresh_to=str(path)) is None
    assert calls == [["--out", str(tmp_path / "static_profile.md")]]


def test_triton_forward_pass_count_follows_the_partial_budget(monkeypatch):
    pytest.importorskip("triton")
    from evidential_ops.triton_backend import launch

    profile = fake_profile()
    # float32 IEEE embeddings take strips of s by default (launch.similarity_strips); the tile
    # kernels' passes are what a traced graph, or EO_TRITON_IEEE_STRIPS_ABOVE_D beyond D, takes
    assert gm.predict("triton", "tcl", "ieee", 16384, 1024, H100, profile)["plans"]["forward"]["strips_of_s"]
    monkeypatch.setattr(launch, "IEEE_SIMILARITY_STRIPS_ABOVE_D", 1 << 30)
    small = gm.predict("triton", "tcl", "ieee", 16384, 1024, H100, profile)
    large = gm.predict("triton", "tcl", "ieee", 65536, 1024, H100, profile)
    assert small["plans"]["forward"]["one_pass"] and not large["plans"]["forward"]["one_pass"]
    # s twice in the forward (two passes), once more for G, G·y and Gᵀ·x: 5 products of 2·K²·D
    assert large["gemm_flops"] == pytest.approx(10 * 65536**2 * 1024)
    assert small["gemm_flops"] == pytest.approx(8 * 16384**2 * 1024)  # s, s again for G, G·y, Gᵀ·x
    # The backward as launch.BackwardPlan plans it: float32 at D = 1024, G in 4 × 5 blocks of
    # 4096 × 3280 (what 64 MiB leaves, rows stored 16-byte aligned), one pass: dx's rows read and
    # written again by each column block after the first (4 times, from L2: 16 MiB of them at a
    # time), dy's by each row block after the first (3 times, from device memory), G written once.
    import torch

    plan = launch.BackwardPlan(16384, 16384, 1024, torch.float32)
    assert small["plans"]["backward"]["kind"] == plan.kind == "blocks"
    assert (plan.block_rows, plan.block_cols) == (4096, 3280)
    grads = [k for k in small["kernels"] if k["name"].startswith("grad_block_kernel")]
    assert len(grads) == 1 and grads[0]["launches"] == 20  # exp evidence: the one SCALED_P variant the flag selects
    gradient_rows = 16384 * 1024 * 4 * 2  # one gradient read and written
    dx = next(k for k in small["kernels"] if k["name"].startswith("cuBLAS G·y"))
    dy = next(k for k in small["kernels"] if k["name"].startswith("cuBLAS Gᵀ·x"))
    assert dx["l2_bytes"]["read-modify-write per block after the first"] == 4 * gradient_rows
    assert dy["dram_bytes"]["read-modify-write per block after the first"] == 3 * gradient_rows
    written = {**grads[0]["l2_bytes"], **grads[0]["dram_bytes"]}["G written, block by block"]
    assert written == 16384 * 16384 * 4
    # bfloat16 with D in one register block: the fused kernel, s recomputed once for both products.
    fused = gm.predict("triton", "tcl", "bf16", 16384, 64, H100, profile)
    assert fused["plans"]["backward"]["kind"] == "fused"
    assert any(k["name"].startswith("grad_fused_kernel") for k in fused["kernels"])
    assert fused["gemm_flops"] == pytest.approx((2 + 6) * 16384**2 * 64)


def test_triton_tf32_at_wide_d_takes_s_from_strips_and_the_least_step_is_its_products_and_elements():
    """Float32 with TF32 products at D = 1024 (launch.similarity_strips): the forward's s and the
    backward's from cuBLAS strips (4 GEMM-equivalents in all, none inside the element kernels, no
    operand traffic there), and least_step: 4 products at the ceiling plus one forward's and one
    backward's element cycles (the fake profile: 100 instructions an element, issue-bound at
    100/128 cycles each way)."""
    pytest.importorskip("triton")
    profile = fake_profile()
    row = gm.predict("triton", "tcl", "tf32", 16384, 1024, H100, profile)
    assert row["plans"]["forward"]["strips_of_s"] and row["plans"]["backward"]["from_s"]
    assert row["gemm_flops"] == pytest.approx(8 * 16384**2 * 1024)
    for kern in row["kernels"]:
        if kern["elements"]:
            assert kern["flops"] == 0 and not any("re-read" in name for name in kern["l2_bytes"]), kern["name"]
    products = [k for k in row["kernels"] if k["name"].startswith("cuBLAS s of")]
    assert [k["phase"] for k in products] == ["forward", "backward"]
    least = row["least"]
    assert least["gemm_s"] == pytest.approx(4 * 2 * 16384**2 * 1024 / 494.7e12)
    assert least["element_s"] == pytest.approx(16384**2 * 2 * 100 / 128 / (132 * 1.98e9))
    # 512 columns: the tile kernels as before (the rows' 128 KiB fit half of L1)
    narrow = gm.predict("triton", "tcl", "tf32", 16384, 512, H100, profile)
    assert not narrow["plans"]["forward"]["strips_of_s"] and not narrow["plans"]["backward"]["from_s"]


def test_cli_writes_markdown_and_json(tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(fake_profile()))
    out = tmp_path / "model.md"
    bench = tmp_path / "cuda_test.json"
    bench.write_text(json.dumps(dict(records=[
        dict(impl="cuda", case="tcl", precision="bf16", k=16384, d=1024, median_s=0.0123, beyond_gradients_mib=77.0),
        dict(impl="floor", case="tcl", precision="bf16", k=16384, d=1024, median_s=0.002)])))
    backends = ["cuda", "triton"] if _has_triton() else ["cuda"]
    assert gm.main(["--out", str(out), "--profile", str(profile), "--device", "h100-sxm", "a100-sxm",
                    "--backend", *backends, "--loss", "tcl", "--precision", "bf16", "--k", "16384", "--d", "1024",
                    "--compare", str(bench)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert len(report["rows"]) == 2 * len(backends)
    text = out.read_text()
    assert "# GPU performance model (predicted, not measured)" in text
    assert "Where the time goes" in text and "NVIDIA A100 SXM4 80 GB" in text
    assert "≤ 3" in text  # the CUDA target beside the K = 16384, D = 1024 row
    printed = capsys.readouterr().out
    assert "| 12.30 |" in printed and "| 6.15 |" in printed  # measured ms and measured × floor


def _has_triton() -> bool:
    try:
        gm._triton_modules()
    except Exception:
        return False
    return True
