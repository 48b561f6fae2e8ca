"""A team's own multi-GPU tests, written with the mgft-doctor plugin (docs/pytest-plugin.md).

Run with `pytest --mgft-doctor` on a GPU runner: the doctor's probes run first as items
`mgft-doctor::<id>`, then these tests."""

import pytest


def all_reduce_sum(rank, world_size, numel):
    """Runs on every rank inside an initialised process group (NCCL on GPUs, gloo on CPU)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.full((numel,), float(rank + 1), device=device)
    dist.all_reduce(t)
    return {"rank": rank, "backend": dist.get_backend(), "device": str(device),
            "correct": bool(torch.all(t == world_size * (world_size + 1) / 2).item())}


def test_all_reduce_on_cpu(mgft_ranks):
    """Runs anywhere: two gloo ranks on the CPU."""
    results = mgft_ranks(all_reduce_sum, nproc=2, backend="gloo", args=(1024,))
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["correct"] for r in results)


@pytest.mark.mgft_gpus(2)  # skipped, with the reason, unless 2 GPUs are visible and nccl.allreduce passes
def test_all_reduce_on_two_gpus(mgft_ranks):
    results = mgft_ranks(all_reduce_sum, nproc=2, args=(1 << 24,))
    assert [r["backend"] for r in results] == ["nccl", "nccl"]
    assert [r["device"] for r in results] == ["cuda:0", "cuda:1"]
    assert all(r["correct"] for r in results)
