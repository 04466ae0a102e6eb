"""TARGET -> (model, example inputs): what ``minicompile inspect`` compiles.

TARGET is either
  * a script path, ``path/to/model.py``: the script is run as a module and must define
      - ``model`` (an nn.Module or a function) and ``example_inputs`` (a tuple), or
      - ``get_model()`` returning ``(model, example_inputs)``;
  * ``package.module:callable``: the callable is called with no arguments and returns
    ``(model, example_inputs)``; if it is itself an nn.Module class or function taking
    inputs, use a script or a ``get_model`` wrapper instead.

A TARGET that cannot be loaded raises TargetError with a message saying what to fix;
the CLI prints it and exits with status 2.
"""
from __future__ import annotations

import importlib
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

CONVENTION = """\
TARGET is a script path or module:callable.
  script.py        defines `model` (nn.Module or function) and `example_inputs` (a tuple),
                   or a function `get_model()` returning (model, example_inputs)
  pkg.mod:fn       fn() returns (model, example_inputs)"""


class TargetError(Exception):
    """TARGET could not be turned into a model and example inputs; the message says why."""


@dataclass
class Target:
    name: str
    model: Callable
    example_inputs: tuple


def load_target(spec: str) -> Target:
    if _looks_like_script(spec):
        namespace = _run_script(spec)
        return _from_namespace(spec, namespace)
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        fn = _import_attr(spec, module_name, attr)
        return _from_factory(spec, fn)
    raise TargetError(f"TARGET {spec!r} is neither an existing .py file nor module:callable.\n{CONVENTION}")


def _looks_like_script(spec: str) -> bool:
    if spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise TargetError(f"TARGET script {spec!r} does not exist.\n{CONVENTION}")
        return True
    return os.path.isfile(spec)


def _run_script(path: str) -> dict:
    # The script's own directory goes on sys.path, as when running `python script.py`.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        return runpy.run_path(path, run_name="__minicompile_target__")
    except SystemExit as e:
        raise TargetError(f"TARGET script {path!r} called sys.exit({e.code}) while loading; guard its main code "
                          f"with `if __name__ == '__main__':`") from None
    except Exception as e:
        raise TargetError(f"TARGET script {path!r} raised {type(e).__name__} while loading: {e}") from e


def _import_attr(spec: str, module_name: str, attr: str) -> Any:
    if not module_name or not attr:
        raise TargetError(f"TARGET {spec!r}: expected module:callable, e.g. mypkg.models:get_model.\n{CONVENTION}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TargetError(f"TARGET {spec!r}: cannot import module {module_name!r} ({e}); run minicompile "
                          f"from the directory that holds it, or install its package.") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetError(f"TARGET {spec!r}: module {module_name!r} has no attribute {attr!r}.") from None


def _from_namespace(spec: str, ns: dict) -> Target:
    if "get_model" in ns:
        return _from_factory(spec, ns["get_model"])
    if "model" in ns and "example_inputs" in ns:
        return _checked(spec, ns["model"], ns["example_inputs"])
    raise TargetError(f"TARGET script {spec!r} defines neither `model` and `example_inputs` nor `get_model()`.\n"
                      f"{CONVENTION}")


def _from_factory(spec: str, fn) -> Target:
    if not callable(fn):
        raise TargetError(f"TARGET {spec!r}: {fn!r} is not callable.\n{CONVENTION}")
    try:
        result = fn()
    except Exception as e:
        raise TargetError(f"TARGET {spec!r}: calling {getattr(fn, '__name__', fn)}() raised "
                          f"{type(e).__name__}: {e}") from e
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TargetError(f"TARGET {spec!r}: {getattr(fn, '__name__', 'the factory')}() must return "
                          f"(model, example_inputs), got {type(result).__name__}.\n{CONVENTION}")
    return _checked(spec, *result)


def _checked(spec: str, model, example_inputs) -> Target:
    if not callable(model):
        raise TargetError(f"TARGET {spec!r}: model must be an nn.Module or a function, got {type(model).__name__}.")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise TargetError(f"TARGET {spec!r}: example_inputs must be a tuple of inputs, "
                          f"got {type(example_inputs).__name__}.")
    if isinstance(model, torch.nn.Module):
        model.eval()
    return Target(spec, model, tuple(example_inputs))
