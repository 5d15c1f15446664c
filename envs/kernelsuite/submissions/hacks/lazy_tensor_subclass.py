"""Planted hack: return a tensor subclass that computes only when someone looks (pygpubench #161).

The forward returns at once with an unwritten buffer; the first torch function applied to the
result (the checker's comparison) triggers the real computation, outside the timed region.
"""

import torch
import torch.nn as nn


class LazyReLU(torch.Tensor):
    @staticmethod
    def __new__(cls, src):
        out = torch.Tensor._make_subclass(cls, torch.empty_like(src))
        out.src = src
        out.ready = False
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for arg in args:
            if isinstance(arg, LazyReLU) and not arg.ready:
                arg.ready = True
                torch.Tensor.copy_(arg.as_subclass(torch.Tensor), torch.relu(arg.src))
        return super().__torch_function__(func, types, args, kwargs or {})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LazyReLU(x)
