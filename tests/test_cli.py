"""The `minicompile` command, run as a subprocess the way users run it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from minicompile.pipeline import _last_frame


def test_source_lines_drop_caret_markers():
    trace = ('  File "/home/u/model.py", line 11, in forward\n'
             '    h = torch.softmax(self.ln(x), dim=-1)\n'
             '        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n')
    assert _last_frame(trace) == "model.py:11: h = torch.softmax(self.ln(x), dim=-1)"
