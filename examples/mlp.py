"""A GELU MLP: two matmuls (extern calls to ATen) with the bias adds and GELU fused around them."""
import torch

from _common import run_example

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
example_inputs = (torch.randn(32, 64),)        # `minicompile inspect examples/mlp.py` reads these two names

if __name__ == "__main__":
    run_example("GELU MLP 32x64 -> 256 -> 64", model, example_inputs)
