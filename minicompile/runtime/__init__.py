"""What compiled graphs need at run time: build and load kernels, the on-disk cache.

Generated wrappers import this package and nothing else of minicompile.
"""
from minicompile.runtime.cpp_build import CompilerNotFound, CppCompileError, KernelLibrary, build, load

__all__ = ["CompilerNotFound", "CppCompileError", "KernelLibrary", "build", "load"]
