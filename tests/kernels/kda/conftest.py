"""Test setup for the KDA kernels: two shims for Triton 3.6's interpreter (TRITON_INTERPRET=1), tests only.

1. The interpreter turns a kernel's scalar arguments into one-element numpy arrays and converts them
   with `int(array)` when they bound a `range` loop; NumPy ≥ 2.4 refuses that conversion. The shim
   reads the element instead.
2. The interpreter stores bf16 as raw uint16 bits and its `tl.dot` multiplies those bits as integers.
   The shim widens bf16 dot operands to fp32 first (exact), as the hardware's bf16 products are.
3. Its fp32 → bf16 cast truncates; the GPU rounds to nearest even. The shim rounds (through torch).
4. It computes tf32 products (`tl.dot`'s default for fp32 operands) in fp32. With `TF32[0] = True`
   the shim truncates fp32 operands to tf32's 10 mantissa bits first, as sm_90's wgmma does with
   the fp32 registers Triton 3.6 hands it (docs/log/kda.md), so tf32-sensitive numerics show.
"""

import numpy as np

try:
    import triton.runtime.interpreter as _interp
    from triton._C.libtriton import ir as _ir
except ImportError:  # no triton: the Triton tests skip themselves
    _interp = None

TF32 = [False]  # shim 4: set TF32[0] = True to truncate tf32 products' operands


def _int_of_one_element_array_fails() -> bool:
    try:
        int(np.array([1]))
    except TypeError:
        return True
    return False


if _interp is not None and _int_of_one_element_array_fails() and hasattr(_interp, "_patch_lang_tensor"):
    _patch_lang_tensor = _interp._patch_lang_tensor

    def _patch_lang_tensor_with_item(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interp._patch_lang_tensor = _patch_lang_tensor_with_item


if _interp is not None and hasattr(_interp, "InterpreterBuilder"):
    _create_dot = _interp.InterpreterBuilder.create_dot

    def _widen_bf16(handle):
        if handle.dtype == _interp.tl.bfloat16:
            bits = handle.data.astype(np.uint32) << np.uint32(16)
            return _interp.TensorHandle(bits.view(np.float32), _interp.tl.float32)
        return handle

    def _truncate_to_tf32(handle):
        if handle.dtype != _interp.tl.float32:
            return handle
        bits = np.ascontiguousarray(handle.data).view(np.uint32) & np.uint32(0xFFFFE000)
        return _interp.TensorHandle(bits.view(np.float32), handle.dtype)

    def _create_dot_widening_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
        if TF32[0] and input_precision == _ir.INPUT_PRECISION.TF32:
            a, b = _truncate_to_tf32(a), _truncate_to_tf32(b)
        return _create_dot(self, _widen_bf16(a), _widen_bf16(b), d, input_precision, max_num_imprecise_acc)

    _interp.InterpreterBuilder.create_dot = _create_dot_widening_bf16
    _cast_impl = _interp.InterpreterBuilder.cast_impl

    def _cast_impl_rounding_bf16(self, src, dst_type):
        if src.dtype.scalar == _interp.tl.float32 and dst_type.scalar == _interp.tl.bfloat16:
            import torch

            bits = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16)
            return _interp.TensorHandle(bits.numpy().view(np.uint16), dst_type.scalar)
        return _cast_impl(self, src, dst_type)

    _interp.InterpreterBuilder.cast_impl = _cast_impl_rounding_bf16
    for _name in ("create_fp_trunc", "create_fp_ext"):
        setattr(_interp.InterpreterBuilder, _name,
                lambda self, src, dst_type: _cast_impl_rounding_bf16(self, src, dst_type))


def poison_allocations() -> None:
    """Every floating-point torch.empty / empty_like from here on starts as NaN (the interpreter
    scripts call it), so an element a kernel forgets to write cannot pass."""
    import torch

    empty, empty_like = torch.empty, torch.empty_like

    def nan_empty(*args, **kwargs):
        x = empty(*args, **kwargs)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    def nan_empty_like(*args, **kwargs):
        x = empty_like(*args, **kwargs)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    torch.empty, torch.empty_like = nan_empty, nan_empty_like
