"""AOT-compile the GEMV kernel for sm_90 on a machine without a GPU and read its SASS loop body.

Run by test_gemv_sass.py in a subprocess without TRITON_INTERPRET (the interpreter replaces the
kernels). It checks that the inline PTX (fma.rn.f16x2, add.rn.f16x2, cvt.rn.f16x2.f32, lop3) passes
ptxas and prints, for the K loops of default_gemv_config's two tiles, the barriers and shared-memory
instructions inside the loop, packed FMAs, instructions per weight value, registers and spills:
    python -m tests.kernels.mx.sass_checks default
With `placement`: where the kernel for a k3 expert weight issues its loads (docs/log/mx.md):
    python -m tests.kernels.mx.sass_checks placement
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.mx.triton import gemv as tm

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INT_ARGS = ("N", "K", "KB", "KB_PER_SPLIT", "NUM_E", "stride_xm", "stride_qn", "stride_sn", "stride_ym", "stride_ps",
            "stride_pm", "stride_qe", "stride_se")


def _compile_gemv(const: dict, num_warps: int, bias: bool = False):
    """_mx_gemv_kernel compiled for sm_90 with the given constexprs (bf16 output, not grouped)."""
    fn = tm._mx_gemv_kernel
    sig = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*u8", "bias_ptr": "*bf16" if bias else "*u8",
           "y_ptr": "*bf16", "p_ptr": "*fp32", "ids_ptr": "*u8"}
    sig.update({name: "i32" for name in INT_ARGS})
    runtime = list(sig)
    const = dict(const, HAS_BIAS=bias, ASM=True, GROUPED=False)
    sig.update({name: "constexpr" for name in const})
    # The JIT's specialization marks 16-divisible pointers and sizes; without it every load is 1 byte.
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in runtime}
    return triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps})


def _sass_and_resources(kernel) -> tuple[str, str]:
    """cuobjdump's SASS listing and resource usage (registers, stack) of a compiled kernel."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return tuple(subprocess.run([os.path.join(BIN, "cuobjdump"), flag, path], capture_output=True, text=True,
                                    check=True).stdout for flag in ("-sass", "-res-usage"))


def gemv_loop(block_n: int, groups: int, num_warps: int, prefetch: bool):
    """SASS opcodes of the K loop of the split-K GEMV kernel compiled for sm_90, its registers, and the
    local-memory (spill) instructions of the whole kernel and its stack bytes."""
    const = dict(ITERS=4, SPLITS=4, BLOCK_N=block_n, GROUPS=groups, PREFETCH=prefetch)
    sass, res = _sass_and_resources(_compile_gemv(const, num_warps))
    rows = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    # The K loop is the one backward branch.
    back = [(int(m.group(1), 16), a) for a, ins in rows if (m := re.search(r"BRA (0x[0-9a-f]+)", ins))
            and int(m.group(1), 16) < a]
    assert len(back) == 1, back
    lo, hi = back[0]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for a, ins in rows if lo <= a <= hi]
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    values = block_n * groups * 32 // (32 * num_warps)  # weight values per thread per iteration
    local = sum(bool(re.search(r"\b(LDL|STL)\b", ins)) for _, ins in rows)
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    return ops, values, regs, {"local_memory_instructions": local, "stack_bytes": stack}


def block_sync_ops(ops) -> dict:
    """Barriers and shared-memory instructions among SASS opcodes: BAR.*, STS/LDS (incl. .128),
    STSM/LDSM (matrix shared stores/loads), ATOMS, shuffles are not shared memory and not counted."""
    kinds = Counter(op.split(".")[0] for op in ops)
    return {"bar": kinds["BAR"], "shared": sum(kinds[k] for k in ("STS", "LDS", "STSM", "LDSM", "ATOMS")),
            "shfl": kinds["SHFL"]}


def default_report() -> dict:
    """The K loops of default_gemv_config's two tiles (7168^2 and a k3 expert's 3584 -> 3072): the
    packed-fp16 elementwise kernel; barriers, shared-memory ops, packed FMAs, instructions per weight
    value, registers and spills."""
    report = {}
    for n, k in ((7168, 7168), (3072, 3584)):
        cfg = tm.default_gemv_config(n, k, torch.device("cpu"))
        ops, values, regs, spill = gemv_loop(cfg.block_n, cfg.groups, cfg.num_warps, cfg.prefetch)
        report[f"{n}x{k}"] = {
            "config": {"block_n": cfg.block_n, "groups": cfg.groups, "num_warps": cfg.num_warps,
                       "prefetch": cfg.prefetch},
            **block_sync_ops(ops), "hfma2": sum(op.split(".")[0] == "HFMA2" for op in ops),
            "loop_instructions": len(ops), "values_per_thread": values,
            "per_value": round(len(ops) / values, 2), "registers": regs, **spill}
    return report


def load_placement(n: int = 3072, k: int = 3584) -> dict:
    """Where default_gemv_config's kernel for an [n, k] weight issues its loads, in its sm_90 SASS
    (one K step, no split): instruction positions of the weight loads (LDG.E.128), the x loads
    (LDG.E.128.CONSTANT), the first and last packed FMA, and the kernel's length."""
    cfg = tm.default_gemv_config(n, k, torch.device("cpu"))
    const = dict(ITERS=1, SPLITS=1, BLOCK_N=cfg.block_n, GROUPS=cfg.groups, PREFETCH=cfg.prefetch)
    sass, _ = _sass_and_resources(_compile_gemv(const, cfg.num_warps))
    ops = [re.sub(r"^@!?U?P\w+\s+", "", m.group(2)).split()[0]
           for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    fma = [i for i, op in enumerate(ops) if op == "HFMA2"]
    return {"config": f"{cfg.block_n} rows x {cfg.groups} blocks, {cfg.num_warps} warps",
            "instructions": len(ops), "weight_loads": [i for i, op in enumerate(ops) if op == "LDG.E.128"],
            "x_loads": [i for i, op in enumerate(ops) if op == "LDG.E.128.CONSTANT"],
            "first_packed_fma": fma[0] if fma else None, "last_packed_fma": fma[-1] if fma else None}


def main() -> int:
    if sys.argv[1:] == ["placement"]:
        print(json.dumps(load_placement()))
        return 0
    if sys.argv[1:] == ["default"]:
        print(json.dumps(default_report()))
        return 0
    raise SystemExit("usage: python -m tests.kernels.mx.sass_checks default|placement")


if __name__ == "__main__":
    sys.exit(main())
