"""AOT-compile the GEMV kernels for sm_90 on a machine without a GPU and read their SASS loop bodies.

Run by test_gemv_f16x2_sass.py in a subprocess without TRITON_INTERPRET (the interpreter replaces
the kernels). It checks that the inline PTX of accumulate="f16x2" (fma.rn.f16x2, add.rn.f16x2,
cvt.rn.f16x2.f32) passes ptxas, and prints instructions per weight value in the main loop:
    python -m tests.kernels.mx.sass_checks
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.mx import triton_matmul as tm

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INT_ARGS = ("N", "K", "KB", "KB_PER_SPLIT", "stride_xm", "stride_qn", "stride_sn", "stride_ym", "stride_ys")


def gemv_loop(accumulate: str, block_n: int = 32, groups: int = 8, num_warps: int = 4, prefetch: bool = True):
    """SASS opcodes of the K loop of the split-K GEMV kernel compiled for sm_90, and its registers."""
    fn = tm._mx_gemv_f16x2_kernel if accumulate == "f16x2" else tm._mx_gemv_kernel
    sig = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*u8", "bias_ptr": "*u8", "y_ptr": "*fp32"}
    sig.update({name: "i32" for name in INT_ARGS})
    const = dict(ITERS=4, HAS_BIAS=False, SPLIT=True, BLOCK_N=block_n, GROUPS=groups, PREFETCH=prefetch)
    if accumulate == "f16x2":
        const["ASM"] = True
    sig.update({name: "constexpr" for name in const})
    # The JIT's specialization marks 16-divisible pointers and sizes; without it every load is 1 byte.
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in list(sig)[:14]}
    kernel = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", path], capture_output=True, text=True,
                             check=True).stdout
    rows = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    # The K loop is the one backward branch.
    back = [(int(m.group(1), 16), a) for a, ins in rows if (m := re.search(r"BRA (0x[0-9a-f]+)", ins))
            and int(m.group(1), 16) < a]
    assert len(back) == 1, back
    lo, hi = back[0]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for a, ins in rows if lo <= a <= hi]
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    values = block_n * groups * 32 // (32 * num_warps)  # weight values per thread per iteration
    return ops, values, regs


def main() -> int:
    report = {}
    for acc in ("f32", "f16x2"):
        for block_n in (32, 64):
            ops, values, regs = gemv_loop(acc, block_n=block_n)
            kinds = Counter(op.split(".")[0] for op in ops)
            report[f"{acc}/block_n={block_n}"] = {
                "loop_instructions": len(ops), "values_per_thread": values,
                "per_value": round(len(ops) / values, 2), "registers": regs,
                # HFMA2.MMA with RZ operands also serves as a move; count the real packed FMAs.
                "hfma2": sum(op.startswith("HFMA2") for op in ops), "ffma": kinds["FFMA"],
                "top": kinds.most_common(8)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
