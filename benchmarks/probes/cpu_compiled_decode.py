"""Does regional torch.compile speed up the tiny model's decode on the CPU? (issue 16: the batch-1 gap)

A random tiny model (no vision), one 128-token prompt, greedy `engine.generate` of 64 tokens: seconds a
step eager, then after `k3model.compiled.compile_regions(model)` (Inductor C++), the first call
(compiling) and two more, and whether the compiled model gave the eager tokens.

    OMP_NUM_THREADS=1 python benchmarks/probes/cpu_compiled_decode.py
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch

from k3model import engine
from k3model.compiled import compile_regions
from k3model.config import get_profile
from k3model.engine import SamplingConfig
from k3model.model import K3Model

NEW = 64


def timed_generate(model, prompts, cfg):
    t = time.perf_counter()
    out = engine.generate(model, prompts, cfg)
    return time.perf_counter() - t, out[0].token_ids


@torch.no_grad()
def main() -> None:
    torch.manual_seed(0)
    model = K3Model(replace(get_profile("tiny").model, vision=None)).eval()
    prompts, cfg = [list(range(5, 133))], SamplingConfig(max_new_tokens=NEW)
    timed_generate(model, prompts, cfg)  # warm-up
    eager_s, eager_ids = timed_generate(model, prompts, cfg)
    compile_regions(model, dynamic=None)
    first_s, _ = timed_generate(model, prompts, cfg)
    runs = [timed_generate(model, prompts, cfg) for _ in range(2)]
    print(json.dumps({"eager_ms_per_step": 1e3 * eager_s / NEW, "compiled_first_call_s": first_s,
                      "compiled_ms_per_step": [1e3 * s / NEW for s, _ in runs],
                      "same_tokens": all(ids == eager_ids for _, ids in runs), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
