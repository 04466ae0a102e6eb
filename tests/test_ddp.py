"""DistributedDataParallel through torch.compile(backend="minicompile"): 2 CPU processes, gloo.

Dynamo's DDP optimizer splits the captured graph at DDP's gradient-bucket boundaries (so each
bucket's all-reduce can start while backward still runs) and hands every piece to our backend
as its own training graph. Each rank trains an eager DDP copy and a compiled DDP copy of the
same module on its own data for 3 SGD-with-momentum steps; the parent compares the losses
and parameters (which the all-reduce makes depend on both ranks' data) and checks that every
piece compiled (a TrainingGraph whose forward and backward each ran 3 times), with the
eager fallback off.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

WORLD_SIZE = 2
STEPS = 3
TOL = dict(rtol=1e-4, atol=1e-5)   # float32; backward sums in another order than eager's kernels

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no torch.distributed with the gloo backend")


class Net(nn.Module):
    """Linear layers with a LayerNorm. Dynamo's DDP optimizer wants buckets of at least DDP's first
    bucket (1 MiB): the 512 x 512 weight (1 MiB) fills one, so the graph splits in two pieces."""

    def __init__(self):
        super().__init__()
        self.fc1, self.ln = nn.Linear(16, 512), nn.LayerNorm(512)
        self.fc2, self.fc3 = nn.Linear(512, 512), nn.Linear(512, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.gelu(self.ln(self.fc1(x))))))


def _train(model, x, y) -> tuple:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, [p.detach().clone() for p in model.parameters()]


def _worker(rank: int, init_method: str, cache_dir: str, out_dir: str) -> None:
    """One rank: eager DDP and compiled DDP from the same weights; results saved for the parent."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import minicompile.backend as backend_module
    from minicompile.aot.runtime import TrainingGraph
    from minicompile.config import patch

    torch.set_num_threads(1)   # two ranks share the machine's cores
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD_SIZE)
    graphs = []
    compile_training = backend_module.compile_training

    def recording(gm, example_inputs, knobs):
        graphs.append(compile_training(gm, example_inputs, knobs))
        return graphs[-1]
    backend_module.compile_training = recording
    try:
        torch.manual_seed(0)
        net = Net()
        torch.manual_seed(1 + rank)   # each rank its own batch: the all-reduce mixes them
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        eager = DDP(Net(), bucket_cap_mb=1)
        eager.module.load_state_dict(net.state_dict())
        compiled_ddp = DDP(Net(), bucket_cap_mb=1)
        compiled_ddp.module.load_state_dict(net.state_dict())
        with patch(fallback_on_error=False, cache_dir=cache_dir):
            ref = _train(eager, x, y)
            got = _train(torch.compile(compiled_ddp, backend="minicompile"), x, y)
        compiled = [(type(g).__name__, getattr(g, "forward_calls", 0), getattr(g, "backward_calls", 0))
                    for g in graphs]
        torch.save(dict(ref=ref, got=got, compiled=compiled, training_graph=TrainingGraph.__name__),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        backend_module.compile_training = compile_training
        dist.destroy_process_group()


def run_ranks(worker, tmp_path) -> list:
    """``worker(rank, init_method, cache_dir, out_dir)`` in WORLD_SIZE processes; each rank's saved
    result. The ranks meet through a file in the test's own directory, not a TCP port: a free port
    picked here could be taken before rank 0 listens on it (by another test worker's ranks, say)."""
    from minicompile.config import config
    init_method = f"file://{tmp_path / 'rendezvous'}"
    torch.multiprocessing.spawn(worker, args=(init_method, config.cache_dir, str(tmp_path)),
                                nprocs=WORLD_SIZE, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]


def assert_losses_and_parameters_match(rank: int, res: dict, what: str = "parameter") -> None:
    (ref_losses, ref_params), (losses, params) = res["ref"], res["got"]
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"rank {rank} step {step} loss: {m}")
    for k, (a, b) in enumerate(zip(params, ref_params)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"rank {rank} {what} {k}: {m}")


def test_ddp_trains_like_eager_ddp(tmp_path):
    results = run_ranks(_worker, tmp_path)
    for rank, res in enumerate(results):
        assert_losses_and_parameters_match(rank, res)
        pieces = res["compiled"]
        assert len(pieces) >= 2, f"rank {rank}: DDP's optimizer should split the graph at buckets: {pieces}"
        assert all(p == (res["training_graph"], STEPS, STEPS) for p in pieces), \
            f"rank {rank}: every piece must compile and run its forward and backward {STEPS} times: {pieces}"
    # the all-reduce made both ranks' parameters equal, though their batches differ
    for a, b in zip(results[0]["got"][1], results[1]["got"][1]):
        torch.testing.assert_close(a, b, **TOL)
    assert not torch.equal(results[0]["got"][0][0], results[1]["got"][0][0]), "ranks should see different data"
