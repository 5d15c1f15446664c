"""Planted hack: capture a graph once and replay it without feeding new inputs (flashinfer-bench #414).

On a GPU this is a CUDA graph whose static input buffer is never refreshed; on the CPU the captured
output is kept the same way. Either way every call after the first returns the first call's answer.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None

    def body(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            self.static_x = x.clone()
            if x.is_cuda:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.static_out = self.body(self.static_x)
            else:
                self.static_out = self.body(self.static_x)
                self.graph = "captured"
        elif x.is_cuda:
            self.graph.replay()
        return self.static_out
