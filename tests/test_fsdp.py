"""FSDP2 (``torch.distributed.fsdp.fully_shard``) through torch.compile(backend="minicompile"):
2 CPU processes, gloo.

Each block and the root are ``fully_shard``'ed: every parameter is a DTensor holding this rank's
half, all-gathered before a block's forward and its gradient reduce-scattered after its backward,
by FSDP's module hooks. Dynamo does not trace those hooks (``torch._dynamo.config.skip_fsdp_hooks``:
they run eagerly, collectives included), so it graph-breaks at each sharded block's call and hands
our backend the code between: each block's forward on the gathered (plain) parameters, and the
root's head. Each rank trains an eager FSDP copy and a compiled FSDP copy of the same model on its
own data for 3 AdamW steps; the parent compares losses and the local parameter shards, and checks
that every graph Dynamo captured compiled (a TrainingGraph whose forward and backward each ran 3
times), with the eager fallback off.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from tests.test_ddp import WORLD_SIZE, assert_losses_and_parameters_match, run_ranks

STEPS = 3

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no torch.distributed with the gloo backend")


class Block(nn.Module):
    """A pre-LayerNorm MLP block with a residual (a Transformer block's second half)."""

    def __init__(self, c=16):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Net(nn.Module):
    """Two sharded blocks and a head. The forward is written out, not a loop: Dynamo skips a whole
    frame that graph-breaks inside a loop, and each sharded block's call is a graph break."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        return self.head(torch.tanh(x))


def _sharded(state) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    model = Net()
    model.load_state_dict(state)
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _train(model, forward, x, y) -> tuple:
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, [p.to_local().detach().clone() for p in model.parameters()]


def _worker(rank: int, init_method: str, cache_dir: str, out_dir: str) -> None:
    """One rank: eager FSDP and compiled FSDP from the same weights; results saved for the parent."""
    import minicompile.backend as backend_module
    from minicompile.aot.runtime import TrainingGraph
    from minicompile.config import patch

    torch.set_num_threads(1)   # two ranks share the machine's cores
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD_SIZE)
    graphs = []
    compile_for_dynamo = backend_module._compile_for_dynamo

    def recording(gm, example_inputs, knobs):
        graphs.append(compile_for_dynamo(gm, example_inputs, knobs))
        return graphs[-1]
    backend_module._compile_for_dynamo = recording
    try:
        torch.manual_seed(0)
        state = Net().state_dict()
        torch.manual_seed(1 + rank)   # each rank its own batch: the reduce-scatter mixes them
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        eager, compiled = _sharded(state), _sharded(state)
        with patch(fallback_on_error=False, cache_dir=cache_dir):
            ref = _train(eager, eager, x, y)
            got = _train(compiled, torch.compile(compiled, backend="minicompile"), x, y)
        pieces = [(type(g).__name__, getattr(g, "forward_calls", 0), getattr(g, "backward_calls", 0)) for g in graphs]
        torch.save(dict(ref=ref, got=got, pieces=pieces, training_graph=TrainingGraph.__name__),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        backend_module._compile_for_dynamo = compile_for_dynamo
        dist.destroy_process_group()


def test_fsdp2_trains_like_eager_fsdp2(tmp_path):
    results = run_ranks(_worker, tmp_path)
    for rank, res in enumerate(results):
        assert_losses_and_parameters_match(rank, res, "parameter shard")
        pieces = res["pieces"]
        # the blocks' forwards and the head: at least three graphs, each compiled for training
        assert len(pieces) >= 3, f"rank {rank}: {pieces}"
        assert all(p == (res["training_graph"], STEPS, STEPS) for p in pieces), \
            f"rank {rank}: every graph must compile and run its forward and backward {STEPS} times: {pieces}"
    assert not torch.equal(results[0]["got"][0][0], results[1]["got"][0][0]), "ranks should see different data"
