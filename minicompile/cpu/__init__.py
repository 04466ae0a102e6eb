"""The CPU backend's performance policy: claims, layouts, prepared weights and measured choices.

``CPU`` (cpu/policy.py) is the one value the pipeline hands to the trace (aot/policy.py says what
a policy holds); nothing below the pipeline imports this package.
"""
from minicompile.cpu.policy import CPU

__all__ = ["CPU"]
