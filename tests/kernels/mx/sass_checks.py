"""AOT-compile the GEMV kernels for sm_90 on a machine without a GPU and read their SASS loop bodies.

Run by test_gemv_f16x2_sass.py in a subprocess without TRITON_INTERPRET (the interpreter replaces
the kernels). It checks that the inline PTX of accumulate="f16x2" (fma.rn.f16x2, add.rn.f16x2,
cvt.rn.f16x2.f32) passes ptxas, and prints instructions per weight value in the main loop:
    python -m tests.kernels.mx.sass_checks
With the argument `loops` (test_gemv_elementwise_sass.py) it prints, for both f32 K loops
(GemvConfig.loop) over BLOCK_N 32/64, GROUPS 4/8, 4/8 warps, the barriers and shared-memory
instructions inside the loop, instructions per weight value, registers and spills (block_sums at
the default tile only, unless `all`):
    python -m tests.kernels.mx.sass_checks loops [all]
With the argument `ordering` (test_gemv_in_kernel_ptx.py) it prints, for reduce="in_kernel", the
PTX facts its memory ordering rests on (see _gemv_epilogue): partial stores, then bar.sync, then
one atom.acq_rel.gpu, then the partial loads through L2 (.cg):
    python -m tests.kernels.mx.sass_checks ordering
With the argument `default` (test_gemv_elementwise_sass.py) it prints the same facts for the K loops
of default_gemv_config's two tiles (packed fp16, loop="elementwise"):
    python -m tests.kernels.mx.sass_checks default
With `placement`: where the default kernel for a k3 expert weight issues its loads (docs/log/mx.md):
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

from kernels.mx import triton_matmul as tm

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
INT_ARGS = ("N", "K", "KB", "KB_PER_SPLIT", "stride_xm", "stride_qn", "stride_sn", "stride_ym", "stride_ps",
            "stride_pm")


def _compile_gemv(accumulate: str, const: dict, num_warps: int, bias: bool = False, loop: str = "block_sums"):
    """The split-K GEMV kernel compiled for sm_90 with the given constexprs (bf16 output)."""
    if accumulate == "f16x2":
        fn = tm._mx_gemv_elem_f16x2_kernel if loop == "elementwise" else tm._mx_gemv_f16x2_kernel
    else:
        fn = tm._mx_gemv_elem_kernel if loop == "elementwise" else tm._mx_gemv_kernel
    sig = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*u8", "bias_ptr": "*bf16" if bias else "*u8",
           "y_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32"}
    grouped = fn is tm._mx_gemv_elem_f16x2_kernel  # its mx_gemv_grouped arguments (GROUPED=False here)
    if grouped:
        sig["ids_ptr"] = "*u8"
    sig.update({name: "i32" for name in INT_ARGS + (("stride_qe", "stride_se") if grouped else ())})
    runtime = list(sig)
    const = dict(const, HAS_BIAS=bias)
    if accumulate == "f16x2" or loop == "elementwise":
        const["ASM"] = True
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


def gemv_loop(accumulate: str, block_n: int = 32, groups: int = 8, num_warps: int = 4, prefetch: bool = True,
              loop: str = "block_sums", spills: bool = False):
    """SASS opcodes of the K loop of the split-K GEMV kernel compiled for sm_90, and its registers;
    with spills=True also the local-memory (spill) instructions of the whole kernel and its stack bytes."""
    const = dict(ITERS=4, SPLITS=4, REDUCE=1, BLOCK_N=block_n, GROUPS=groups, PREFETCH=prefetch)
    sass, res = _sass_and_resources(_compile_gemv(accumulate, const, num_warps, loop=loop))
    rows = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    # The K loop is the one backward branch.
    back = [(int(m.group(1), 16), a) for a, ins in rows if (m := re.search(r"BRA (0x[0-9a-f]+)", ins))
            and int(m.group(1), 16) < a]
    assert len(back) == 1, back
    lo, hi = back[0]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0] for a, ins in rows if lo <= a <= hi]
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    values = block_n * groups * 32 // (32 * num_warps)  # weight values per thread per iteration
    if spills:
        local = sum(bool(re.search(r"\b(LDL|STL)\b", ins)) for _, ins in rows)
        stack = int(re.search(r"STACK:(\d+)", res).group(1))
        return ops, values, regs, {"local_memory_instructions": local, "stack_bytes": stack}
    return ops, values, regs


def block_sync_ops(ops) -> dict:
    """Barriers and shared-memory instructions among SASS opcodes: BAR.*, STS/LDS (incl. .128),
    STSM/LDSM (matrix shared stores/loads), ATOMS, shuffles are not shared memory and not counted."""
    kinds = Counter(op.split(".")[0] for op in ops)
    return {"bar": kinds["BAR"], "shared": sum(kinds[k] for k in ("STS", "LDS", "STSM", "LDSM", "ATOMS")),
            "shfl": kinds["SHFL"]}


LOOP_GRID = [(bn, g, w) for bn in (32, 64) for g in (4, 8) for w in (4, 8)]


def loop_report(full: bool = False) -> dict:
    """The elementwise f32 loop over BLOCK_N 32/64, GROUPS 4/8, 4/8 warps (prefetch on), and the
    block_sums loop at the default tile (all 8 tiles with full=True): per configuration the loop's
    barriers, shared-memory ops, instructions per weight value, registers and spills."""
    report = {}
    for loop in ("block_sums", "elementwise"):
        for bn, g, w in LOOP_GRID if full or loop == "elementwise" else [(32, 8, 4)]:
            ops, values, regs, spill = gemv_loop("f32", block_n=bn, groups=g, num_warps=w, loop=loop, spills=True)
            report[f"{loop}/bn{bn}/g{g}/w{w}"] = {
                **block_sync_ops(ops), "ffma": sum(op.split(".")[0] == "FFMA" for op in ops),
                "loop_instructions": len(ops), "values_per_thread": values,
                "per_value": round(len(ops) / values, 2), "registers": regs, **spill}
    return report


def default_report() -> dict:
    """The K loops of default_gemv_config's two tiles (7168^2 and a k3 expert's 3584 -> 3072): the
    packed-fp16 elementwise kernel; barriers, shared-memory ops, packed FMAs, instructions per weight
    value, registers and spills."""
    report = {}
    for n, k in ((7168, 7168), (3072, 3584)):
        cfg = tm.default_gemv_config(n, k, torch.device("cpu"))
        ops, values, regs, spill = gemv_loop(cfg.accumulate, block_n=cfg.block_n, groups=cfg.groups,
                                             num_warps=cfg.num_warps, prefetch=cfg.prefetch, loop=cfg.loop,
                                             spills=True)
        report[f"{n}x{k}"] = {
            "config": {"accumulate": cfg.accumulate, "loop": cfg.loop, "block_n": cfg.block_n,
                       "groups": cfg.groups, "num_warps": cfg.num_warps, "prefetch": cfg.prefetch},
            **block_sync_ops(ops), "hfma2": sum(op.split(".")[0] == "HFMA2" for op in ops),
            "loop_instructions": len(ops), "values_per_thread": values,
            "per_value": round(len(ops) / values, 2), "registers": regs, **spill}
    return report


def load_placement(n: int = 3072, k: int = 3584) -> dict:
    """Where default_gemv_config's kernel for an [n, k] weight issues its loads, in its sm_90 SASS
    (one K step, no split): instruction positions of the weight loads (LDG.E.128), the x loads
    (LDG.E.128.CONSTANT), the first and last packed FMA, and the kernel's length."""
    cfg = tm.default_gemv_config(n, k, torch.device("cpu"))
    const = dict(ITERS=1, SPLITS=1, REDUCE=0, BLOCK_N=cfg.block_n, GROUPS=cfg.groups, PREFETCH=cfg.prefetch)
    sass, _ = _sass_and_resources(_compile_gemv(cfg.accumulate, const, cfg.num_warps, loop=cfg.loop))
    ops = [re.sub(r"^@!?U?P\w+\s+", "", m.group(2)).split()[0]
           for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    fma = [i for i, op in enumerate(ops) if op == "HFMA2"]
    return {"config": f"{cfg.block_n} rows x {cfg.groups} blocks, {cfg.num_warps} warps",
            "instructions": len(ops), "weight_loads": [i for i, op in enumerate(ops) if op == "LDG.E.128"],
            "x_loads": [i for i, op in enumerate(ops) if op == "LDG.E.128.CONSTANT"],
            "first_packed_fma": fma[0] if fma else None, "last_packed_fma": fma[-1] if fma else None}


def in_kernel_ordering(accumulate: str, splits: int = 7) -> dict:
    """PTX facts of reduce="in_kernel" (REDUCE = 2) at the default tile, with a bias."""
    const = dict(ITERS=4, SPLITS=splits, REDUCE=2, BLOCK_N=32, GROUPS=8, PREFETCH=True)
    ptx = _compile_gemv(accumulate, const, num_warps=4, bias=True).asm["ptx"]
    lines = [ln.strip() for ln in ptx.splitlines()]
    atoms = [i for i, ln in enumerate(lines) if re.search(r"\batom\.", ln)]
    at = atoms[0] if atoms else len(lines)
    # The partial stores are the fp32 (b32) global stores before the atomic.
    stores = [i for i, ln in enumerate(lines[:at]) if re.search(r"st\.global\.b32", ln)]
    between = lines[stores[-1] + 1:at] if stores else []
    after = lines[at + 1:]
    loads_f32 = [ln for ln in after if re.search(r"ld\.global\S*\.b32", ln)]
    first_load = next((i for i, ln in enumerate(after) if "ld.global" in ln), len(after))
    return {
        "atomics": [lines[i].split("atom.")[1].split()[0] for i in atoms],
        "partial_stores_before_atomic": len(stores),
        "bar_sync_between_stores_and_atomic": any(ln.startswith("bar.sync") for ln in between),
        "bar_sync_between_atomic_and_loads": any(ln.startswith("bar.sync") for ln in after[:first_load]),
        "partial_loads": len(loads_f32),
        "partial_loads_cg": sum(".cg." in ln for ln in loads_f32),
        "splits": splits,
    }


def main() -> int:
    if sys.argv[1:2] == ["loops"]:
        print(json.dumps(loop_report(full=sys.argv[2:] == ["all"])))
        return 0
    if sys.argv[1:] == ["placement"]:
        print(json.dumps(load_placement()))
        return 0
    if sys.argv[1:] == ["default"]:
        print(json.dumps(default_report()))
        return 0
    if sys.argv[1:] == ["ordering"]:
        print(json.dumps({acc: in_kernel_ordering(acc) for acc in ("f32", "f16x2")}))
        return 0
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
