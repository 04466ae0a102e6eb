"""layer_norm followed by softmax: each normalisation is one kernel that reads a row from cache."""
import torch
import torch.nn.functional as F

from _common import run_example


def norm_then_softmax(x, w, b):
    return torch.softmax(F.layer_norm(x, (x.shape[-1],), w, b) * 2.0, dim=-1)


torch.manual_seed(0)
model = norm_then_softmax                      # what `minicompile inspect` compiles
example_inputs = (torch.randn(64, 128), torch.randn(128), torch.randn(128))

if __name__ == "__main__":
    run_example("layer_norm + softmax 64x128", model, example_inputs)
