"""Test setup for the KDA kernels: two shims for Triton 3.6's interpreter (TRITON_INTERPRET=1), tests only.

1. The interpreter turns a kernel's scalar arguments into one-element numpy arrays and converts them
   with `int(array)` when they bound a `range` loop; NumPy ≥ 2.4 refuses that conversion. The shim
   reads the element instead.
2. The interpreter stores bf16 as raw uint16 bits and its `tl.dot` multiplies those bits as integers.
   The shim widens bf16 dot operands to fp32 first (exact), as the hardware's bf16 products are.
3. Its fp32 → bf16 cast truncates; the GPU rounds to nearest even. The shim rounds (through torch).
"""

import numpy as np

try:
    import triton.runtime.interpreter as _interp
except ImportError:  # no triton: the Triton tests skip themselves
    _interp = None


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

    def _create_dot_widening_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
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
