"""Registers and spills per thread of the Triton glue kernels at the small profile's launch shapes, for
sm_90 (the H200), without a GPU: each kernel is compiled to PTX for that target on this machine and
the PTX assembled by triton's own ptxas with -v. A kernel that spills moves its spilled values through
local memory (L1, then L2 and DRAM) on every use: at 128 threads a program and thousands of programs,
a few KB a thread is a GB of traffic a launch.

    PYTHONPATH=. python3 benchmarks/probes/kernel_registers.py --out $OUT/kernel_registers.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.common import run_header, write_json

TARGET = GPUTarget("cuda", 90, 64)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def registers(fn, signature: dict, constexprs: dict, num_warps: int) -> dict:
    """{"registers", "spill_stores_bytes", "spill_loads_bytes"} per thread, from ptxas -v for sm_90a."""
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=TARGET,
                            options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "kernel.cubin")],
                             capture_output=True, text=True, check=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_stores_bytes": int(spills.group(1)) if spills else None,
            "spill_loads_bytes": int(spills.group(2)) if spills else None}


def cases():
    """(kernel name, constants, fn, signature, constexprs, warps) at the training shapes: the conv's q / k
    (head_dim 128, L2 norm) at its swept row counts, KDA's pairs backward, AttnRes at D = 1024, the MoE
    rows at L = 512."""
    import kernels.attn_res.triton as ar
    import kernels.kda.triton.bwd as kda_bwd
    import kernels.moe_rows.triton as mr
    import kernels.short_conv.triton as sc

    conv = {"x": "*bf16", "w": "*fp32", "N": "i32", "T": "i32", "C": "constexpr"}
    norm = {"C": 1024, "W": 4, "CB": 128, "BC": 128, "NORM": True}
    for rows, warps in ((16, 4), (32, 4), (64, 4), (64, 8), (128, 8)):
        yield ("short_conv._fwd_kernel", {"FWD_ROWS": rows, "FWD_WARPS": warps}, sc._fwd_kernel,
               {**conv, "y": "*bf16", "eps2": "fp32", **dict.fromkeys(["W", "CB", "BT", "BC", "NORM"], "constexpr")},
               {**norm, "BT": rows}, warps)
        yield ("short_conv._bwd_dp_kernel", {"BWD_ROWS": rows, "BWD_WARPS": warps}, sc._bwd_dp_kernel,
               {**conv, "dy": "*bf16", "dp": "*fp32", "eps2": "fp32",
                **dict.fromkeys(["W", "CB", "BT", "BC", "NORM"], "constexpr")}, {**norm, "BT": rows}, warps)
        yield ("short_conv._bwd_dx_kernel", {"BWD_ROWS": rows, "BWD_WARPS": warps}, sc._bwd_dx_kernel,
               {"x": "*bf16", "w": "*fp32", "dp": "*fp32", "dx": "*bf16", "dw_part": "*fp32", "N": "i32", "T": "i32",
                "C": "constexpr", **dict.fromkeys(["W", "CB", "BT", "BC", "BW"], "constexpr")},
               {"C": 1024, "W": 4, "CB": 128, "BT": rows, "BC": 128, "BW": 4}, warps)
    # KDA's pairs backward (8 heads of 128), the step's largest kernel (86 ms), at its key slices.
    pairs = {n: "*bf16" for n in ("q", "k", "beta", "dq", "dk", "dbeta")}
    pairs.update({n: "*fp32" for n in ("Gs", "dAs", "dQG", "dKG", "dXH", "dGAM", "DB", "dg")})
    for bks, warps in ((16, 8), (32, 8), (32, 4)):
        yield ("kda._bwd_pairs_kernel", {"bwd_key_slice": bks, "bwd_pairs_warps": warps}, kda_bwd._bwd_pairs_kernel,
               {**pairs, "scale": "fp32", "T": "i32", **dict.fromkeys(["H", "K", "BKS", "SHIFT", "CLAMP"], "constexpr")},
               {"H": 8, "K": 128, "BKS": bks, "SHIFT": 64.0, "CLAMP": 100.0}, warps)
    block_m, block_d, one_chunk, warps = ar._tiles(1024)
    slots = {f"v{i}": ("*fp32" if i == 0 else "*bf16") for i in range(4)}
    for n in (2, 3):
        yield ("attn_res._fwd_kernel", {"N": n}, ar._fwd_kernel,
               {**slots, "wq": "*fp32", "h": "*fp32", "M": "i32", "D": "i32", "eps": "fp32",
                **dict.fromkeys(["N", "BLOCK_M", "BLOCK_D", "ONE_CHUNK"], "constexpr")},
               {"N": n, "BLOCK_M": block_m, "BLOCK_D": block_d, "ONE_CHUNK": one_chunk}, warps)
        yield ("attn_res._bwd_kernel", {"N": n}, ar._bwd_kernel,
               {**slots, **{f"dv{i}": ("*fp32" if i == 0 else "*bf16") for i in range(4)}, "wq": "*fp32", "dh": "*fp32",
                "dwq_part": "*fp32", "M": "i32", "D": "i32", "eps": "fp32", "n_blocks": "i32",
                "blocks_per_program": "i32", **dict.fromkeys(["N", "BLOCK_M", "BLOCK_D", "ONE_CHUNK"], "constexpr")},
               {"N": n, "BLOCK_M": block_m, "BLOCK_D": block_d, "ONE_CHUNK": one_chunk}, warps)
    block_m, block_l = mr._tiles(512)
    for weighted in (False, True):
        yield ("moe_rows._gather_sum_kernel", {"WEIGHTED": weighted}, mr._gather_sum_kernel,
               {"src_ptr": "*bf16", "inv_ptr": "*i64", "w_ptr": "*fp32", "out_ptr": "*bf16", "M": "i32", "L": "i32",
                "K": "i32", **dict.fromkeys(["WEIGHTED", "BLOCK_M", "BLOCK_L"], "constexpr")},
               {"WEIGHTED": weighted, "BLOCK_M": block_m, "BLOCK_L": block_l}, mr.NUM_WARPS)
    yield ("moe_rows._combine_bwd_kernel", {}, mr._combine_bwd_kernel,
           {"du_ptr": "*bf16", "y_ptr": "*bf16", "p_ptr": "*fp32", "inv_ptr": "*i64", "dy_ptr": "*bf16", "dp_ptr": "*fp32",
            "M": "i32", "L": "i32", "K": "i32", **dict.fromkeys(["BLOCK_M", "BLOCK_L"], "constexpr")},
           {"BLOCK_M": block_m, "BLOCK_L": block_l}, mr.NUM_WARPS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = {"env": run_header(), "target": "sm_90a", "rows": []}
    for name, constants, fn, signature, constexprs, warps in cases():
        row = {"kernel": name, "constants": constants, "num_warps": warps}
        try:
            row.update(registers(fn, signature, constexprs, warps))
        except Exception as e:  # one that does not compile: recorded, the rest still run
            row["error"] = repr(e)[:300]
        print(json.dumps(row), flush=True)
        report["rows"].append(row)
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
