"""libdevice for the Triton interpreter: numpy stand-ins for the math Triton leaves to CUDA.

Under ``TRITON_INTERPRET=1`` (how minicompile runs Triton kernels on CPU tensors) the calls
``libdevice.tanh`` etc. have no implementation: they are extern calls into CUDA's bitcode
library. Generated kernels take ``libdevice`` from ``pick_libdevice()``, which is the real module on a GPU
and this shim in the interpreter, so the same kernel text runs in both places.
"""
from __future__ import annotations

import math

import numpy as np
import triton
import triton.language as tl
from triton.language.extra import libdevice as _real_libdevice

_NP = {tl.float16: np.float16, tl.float32: np.float32, tl.float64: np.float64}


def _lift(fn, returns_bool=False):
    """An elementwise libdevice function computed by numpy on the interpreter's arrays."""
    from triton.runtime.interpreter import TensorHandle  # only importable where the interpreter runs

    def call(*args):
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        ref = tensors[0]
        data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*data))
        dtype = tl.int1 if returns_bool else ref.dtype
        out = out.astype(np.bool_ if returns_bool else _NP[ref.dtype])
        shapes = [list(t.type.shape) for t in tensors if t.type.is_block()]
        if shapes:
            shape = list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
            return tl.tensor(TensorHandle(out, dtype), tl.block_type(dtype, shape))
        return tl.tensor(TensorHandle(out, dtype), dtype)
    call.__name__ = getattr(fn, "__name__", "libdevice_fn")
    return call


class InterpreterLibdevice:
    """The libdevice functions minicompile's Triton templates use, in numpy."""
    tanh = staticmethod(_lift(np.tanh))
    sinh = staticmethod(_lift(np.sinh))
    cosh = staticmethod(_lift(np.cosh))
    tan = staticmethod(_lift(np.tan))
    asin = staticmethod(_lift(np.arcsin))
    acos = staticmethod(_lift(np.arccos))
    atan = staticmethod(_lift(np.arctan))
    asinh = staticmethod(_lift(np.arcsinh))
    acosh = staticmethod(_lift(np.arccosh))
    atanh = staticmethod(_lift(np.arctanh))
    expm1 = staticmethod(_lift(np.expm1))
    log1p = staticmethod(_lift(np.log1p))
    log10 = staticmethod(_lift(np.log10))
    pow = staticmethod(_lift(np.power))
    atan2 = staticmethod(_lift(np.arctan2))
    fmod = staticmethod(_lift(np.fmod))
    nearbyint = staticmethod(_lift(np.rint))
    trunc = staticmethod(_lift(np.trunc))
    isnan = staticmethod(_lift(np.isnan, returns_bool=True))
    isinf = staticmethod(_lift(np.isinf, returns_bool=True))

    @staticmethod
    def erfc(x):
        return _lift(np.vectorize(math.erfc, otypes=[np.float64]))(x)


def interpreting() -> bool:
    """Whether kernels defined now run in Triton's interpreter (``TRITON_INTERPRET=1`` while a
    generated module is imported for CPU tensors) rather than compile for a GPU."""
    return bool(triton.knobs.runtime.interpret)


def pick_libdevice():
    """The real libdevice when kernels compile for a GPU, the numpy shim in the interpreter."""
    return InterpreterLibdevice if interpreting() else _real_libdevice
