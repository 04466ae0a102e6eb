"""minicompile: a small, readable PyTorch compiler.

    torch.compile(model, backend="minicompile")   # Dynamo captures, minicompile compiles
    minicompile.compile(model)                      # minicompile's own bytecode capture
"""
from minicompile import config as _config_module
from minicompile.config import config, patch

__all__ = ["config", "patch"]
