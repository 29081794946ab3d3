"""Turn a pytest-benchmark JSON (bench/test_bench_loss.py) into the markdown table of docs/benchmarks.md.

    python bench/report.py bench/results/cpu.json [--out bench/results/cpu.md]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from evidential_ops.benchmark import format_table


def results_from_json(path: pathlib.Path) -> list[dict]:
    data = json.loads(path.read_text())
    rows = []
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        if "impl" not in info or "extra_peak_mib" in info or "paired_rounds" in info:
            continue
        # The fastest round, not the median: on a shared VM a core stolen for a moment stalls a
        # whole parallel region, which the median of a few rounds still shows. Every
        # implementation is treated alike; the JSON keeps all the statistics.
        rows.append({"case": info["case"], "k": info["k"], "impl": info["impl"], "seconds": bench["stats"]["min"]})
    return sorted(rows, key=lambda r: (r["k"], r["case"]))


def memory_table(path: pathlib.Path) -> str:
    """Markdown table of the extra peak memory (MiB) entries of bench/test_bench_memory.py."""
    data = json.loads(path.read_text())
    cells: dict[tuple, dict[str, float]] = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        if "extra_peak_mib" in info:
            cells.setdefault((info["case"], info["k"]), {})[info["impl"]] = info["extra_peak_mib"]
    if not cells:
        return ""
    impls = sorted({impl for row in cells.values() for impl in row})
    lines = ["| loss | K | " + " | ".join(f"{i} MiB" for i in impls) + " |", "|" + "---|" * (len(impls) + 2)]
    for (case, k), row in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
        lines.append(f"| {case} | {k} | " + " | ".join(f"{row[i]:.1f}" if i in row else "" for i in impls) + " |")
    return "\n\nExtra peak memory of forward + backward (fresh process, see bench/memory_probe.py):\n\n" + "\n".join(lines)


def _paired_block(rows: list, columns: list[str], cells, intro: str) -> str:
    """One paired table: `columns` after loss, K and backend, `cells(row)` their values, rows in
    (K, loss, backend) order, under `intro` (which names the rounds)."""
    lines = ["| loss | K | backend | " + " | ".join(columns) + " |", "|---" * (3 + len(columns)) + "|"]
    for r in sorted(rows, key=lambda r: (r["k"], r["case"], r["impl"])):
        lines.append(f"| {r['case']} | {r['k']} | {r['impl']} | " + " | ".join(cells(r)) + " |")
    return f"\n\n{intro.format(rounds=rows[0]['paired_rounds'])}:\n\n" + "\n".join(lines)


def paired_table(path: pathlib.Path) -> str:
    """Markdown tables of the entries measured interleaved (bench/test_bench_loss.py): fused against
    the floor, and fused against the floor and torch.compile."""
    data = json.loads(path.read_text())
    rows = [b["extra_info"] for b in data["benchmarks"] if "paired_rounds" in b.get("extra_info", {})]
    with_floor = [r for r in rows if "compiled_seconds" not in r]
    with_compiled = [r for r in rows if "compiled_seconds" in r]
    out = ""
    if with_floor:
        out += _paired_block(
            with_floor, ["fused ms", "floor ms", "fused ÷ floor"],
            lambda r: [f"{r['fused_seconds'] * 1e3:.1f}", f"{r['floor_seconds'] * 1e3:.1f}",
                       f"{r['fused_seconds'] / r['floor_seconds']:.2f}"],
            "Fused against the floor measured paired (the two steps alternating in one loop, fastest of "
            "{rounds} rounds each; the table above times each implementation in its own block of rounds, between "
            "which a shared machine's speed drifts)")
    if with_compiled:
        out += _paired_block(
            with_compiled,
            ["fused ms", "floor ms", "compiled ms", "fused ÷ floor", "compiled ÷ floor", "fused vs compiled"],
            lambda r: [f"{r['fused_seconds'] * 1e3:.1f}", f"{r['floor_seconds'] * 1e3:.1f}",
                       f"{r['compiled_seconds'] * 1e3:.1f}", f"{r['fused_seconds'] / r['floor_seconds']:.2f}",
                       f"{r['compiled_seconds'] / r['floor_seconds']:.2f}",
                       f"{r['compiled_seconds'] / r['fused_seconds']:.2f}×"],
            "Fused against torch.compile measured paired (fused, floor and compiled steps alternating in one loop, "
            "fastest of {rounds} rounds each; only where compiled is near 3× the fused op, bench/test_bench_loss.py)")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    machine = data.get("machine_info", {})
    header = (
        f"Machine: {machine.get('cpu', {}).get('brand_raw', machine.get('processor', '?'))}, "
        f"{machine.get('cpu', {}).get('count', '?')} cores; fastest of the rounds of forward + backward, D = 512, float32.\n\n"
    )
    speed = results_from_json(args.json)
    table = (header + (format_table(speed) if speed else "(no speed entries)") + paired_table(args.json)
             + memory_table(args.json))
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
