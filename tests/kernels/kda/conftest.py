"""Test setup for the KDA kernels.

Triton 3.6's interpreter (TRITON_INTERPRET=1) turns a kernel's scalar arguments into one-element
numpy arrays and converts them with `int(array)` when they bound a `range` loop; NumPy ≥ 2.4 refuses
that conversion. Until Triton's interpreter reads `.item()` itself, this shim does it, for the tests only.
"""

import numpy as np


def _interpreter_needs_index_shim() -> bool:
    try:
        int(np.array([1]))
    except TypeError:
        return True
    return False


if _interpreter_needs_index_shim():
    try:
        import triton.runtime.interpreter as _interp
    except ImportError:  # no triton: the Triton tests skip themselves
        _interp = None
    if _interp is not None and hasattr(_interp, "_patch_lang_tensor"):
        _patch_lang_tensor = _interp._patch_lang_tensor

        def _patch_lang_tensor_with_item(tensor, scope):
            _patch_lang_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        _interp._patch_lang_tensor = _patch_lang_tensor_with_item
