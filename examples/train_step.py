"""One training step, compiled: the forward and backward of a small model, gradients checked
against eager. Run it with MINICOMPILE_DEBUG=3 to see the joint graph, the partition and both
halves (docs/training.md, "A training step at MINICOMPILE_DEBUG=3")."""
import copy

import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = F.layer_norm(self.fc1(x), (32,))
        return self.fc2(F.gelu(h)).tanh()


torch.manual_seed(0)
model = Model()
eager = copy.deepcopy(model)
x = torch.randn(8, 16)

loss = torch.compile(model, backend="minicompile")(x).square().mean()
loss.backward()
eager(x).square().mean().backward()

ok = all(torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5) for p, q in zip(model.parameters(), eager.parameters()))
print(f"loss {loss.item():.6f}; gradients vs eager: {'OK' if ok else 'MISMATCH'}")
raise SystemExit(0 if ok else 1)
