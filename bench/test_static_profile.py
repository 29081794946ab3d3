"""bench/static_profile.py: its SASS parsing and loop finding on a hand-written snippet, and the
script itself on one kernel where nvcc (or triton) can compile here."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import static_profile as sp  # noqa: E402

# nvdisasm's layout: an outer loop (.L_x_0) around an inner one (.L_x_1) that loads, does some
# float64 math, skips a block on a condition (.L_x_2) and switches through BRX; a CALL to a
# subroutine after EXIT; the BRA-to-itself trap nvcc puts after the last EXIT.
SNIPPET = """\
\t.section\t.text.k,"ax",@progbits
.text.k:
        .type           k,@function
k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/                   IMAD.MOV.U32 R2, RZ, RZ, R0 ;
.L_x_1:
        /*0030*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0040*/                   F2F.F64.F32 R4, R4 ;
        /*0050*/                   DMUL R6, R4, R4 ;
        /*0060*/                   DFMA R6, R6, R4, 1 ;
        /*0070*/                   DSETP.GT.AND P0, PT, R6, RZ, PT ;
        /*0080*/              @!P0 BRA `(.L_x_2) ;
        /*0090*/                   MUFU.RCP64H R9, R7 ;
        /*00a0*/                   DFMA R6, R6, R8, R6 ;
        /*00b0*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm20_div_rn_f64_full) ;
.L_x_2:
        /*00c0*/                   FFMA R10, R4, R4, R10 ;
        /*00d0*/                   BRX R12 -0xe0                      (*"BRANCH_TARGETS .L_x_3,.L_x_4"*);
.L_x_3:
        /*00e0*/                   STG.E desc[UR4][R2.64], R6 ;
        /*00f0*/                   BRA `(.L_x_5) ;
.L_x_4:
        /*0100*/                   STG.E.64 desc[UR4][R2.64], R6 ;
.L_x_5:
        /*0110*/                   IADD3 R2, R2, 0x4, RZ ;
        /*0120*/                   ISETP.NE.AND P1, PT, R2, R3, PT ;
        /*0130*/               @P1 BRA `(.L_x_1) ;
        /*0140*/                   SHFL.BFLY PT, R11, R10, 0x1, 0x1f ;
        /*0150*/                   ISETP.NE.AND P2, PT, R0, R11, PT ;
        /*0160*/               @P2 BRA `(.L_x_0) ;
        /*0170*/                   EXIT ;
$__internal_0_$__cuda_sm20_div_rn_f64_full:
        /*0180*/                   DFMA R6, R6, R6, R6 ;
        /*0190*/                   RET.REL.NODEC R20 `(k) ;
.L_x_6:
        /*01a0*/                   BRA `(.L_x_6);
        /*01b0*/                   NOP;
"""


def test_classify():
    assert sp.classify("DFMA") == "fp64"
    assert sp.classify("F2F.F64.F32") == "fp64"
    assert sp.classify("F2F.F16.F32") == "conv"
    assert sp.classify("MUFU.RCP64H") == "mufu"
    assert sp.classify("FFMA") == "fp32"
    assert sp.classify("IMAD.MOV.U32") == "int"
    assert sp.classify("UIADD3") == "int"
    assert sp.classify("ULDC.64") == "mem"
    assert sp.classify("LDG.E.64") == "mem"
    assert sp.classify("HGMMA.64x64x16.F32") == "tensor"
    assert sp.classify("BSSY") == "control"
    assert sp.classify("SHFL.BFLY") == "other"


def test_snippet_loops_and_counts():
    functions = sp.parse_sass(SNIPPET)
    assert list(functions) == ["k"]
    fn = functions["k"]
    assert fn.labels[".L_x_1"] == 0x30 and fn.labels["$__internal_0_$__cuda_sm20_div_rn_f64_full"] == 0x180
    result = sp.analyse(fn, "element-load")
    loops = {lp["header"]: lp for lp in result["loops"]}
    # the trap at 0x1a0 follows an EXIT: unreachable, not a loop
    assert sorted(loops) == ["0x0020", "0x0030"]
    outer, inner = loops["0x0020"], loops["0x0030"]
    assert (outer["depth"], inner["depth"]) == (1, 2)
    assert outer["nested"] == ["0x0030"] and inner["ranges"] == ["0x0030-0x0130"]
    assert inner["hot"] and result["hot"] is inner
    own = inner["own"]
    # 17 instructions 0x30..0x130; FP64: F2F.F64.F32, DMUL, DFMA x2, DSETP
    assert own["total"] == 17
    assert (own["fp64"], own["dmul_dfma"], own["fp32"], own["mufu"]) == (5, 3, 1, 1)
    assert (own["mem"], own["int"], own["control"]) == (3, 2, 5)
    assert sum(own[c] for c in sp.CLASSES) == own["total"]
    assert inner["calls"] == 1
    # longest path: every block but one arm of the BRX switch (the STG/BRA arm: 2 > 1)
    assert inner["max_path"] == 16
    assert outer["own"]["total"] == 4 and outer["max_path"] == 4
    # whole kernel: NOP left out, the subroutine and the trap in
    assert result["counts"]["total"] == 27
    assert result["counts"]["dmul_dfma"] == 4 and result["subroutines"]["dmul_dfma"] == 1
    tile = sp.analyse(fn, "tile-sweep")
    assert tile["hot"]["header"] == "0x0020"


def test_skips_without_nvcc(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sp, "find_nvcc", lambda: None)
    monkeypatch.setattr(sp, "find_nvdisasm", lambda nvcc: "nvdisasm")
    out = tmp_path / "static_profile_skip.md"
    assert sp.main(["--backend", "cuda", "--out", str(out)]) == 0
    assert "nvcc not found" in capsys.readouterr().out
    assert not out.exists()


def test_one_kernel(tmp_path):
    """TCL forward, compiled and profiled for real: CUDA (the float32/exp instantiation) where nvcc
    is installed, else the Triton stats kernel where triton can compile."""
    nvcc = sp.find_nvcc()
    if sp.find_nvdisasm(nvcc) is None:
        pytest.skip("no nvdisasm (CUDA toolkit or triton's copy)")
    if nvcc is not None:
        backend, elements = "cuda", sp.cuda_elements_per_iteration("fwd")
    else:
        pytest.importorskip("triton")
        backend, elements = "triton", None
    out = tmp_path / "static_profile_test.md"
    run = subprocess.run([sys.executable, str(HERE / "static_profile.py"), "--backend", backend, "--loss", "tcl",
                          "--direction", "fwd", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600)
    assert run.returncode == 0, run.stdout
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["header"]["label"] == "test"
    (row,) = report["rows"]
    assert row["method"] == "tcl" and row["direction"] == "fwd" and "warning" not in row, row.get("warning")
    hot = row["hot"]
    assert hot is not None and hot["own"]["total"] > 50
    assert sum(hot["own"][c] for c in sp.CLASSES) == hot["own"]["total"]
    assert row["counts"]["total"] >= hot["own"]["total"]
    assert row["resources"]["registers"] > 0
    if elements is not None:
        assert row["elements_per_iteration"] == elements and row["s_loads_in_loop"] == elements
    text = out.read_text()
    assert "| TCL forward |" in text and "## Loops" in text
