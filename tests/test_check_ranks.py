"""How many ranks each multi-rank probe uses (DESIGN §3): one per visible GPU, all of them; one
NCCL rank on a one-GPU machine (plus a two-rank gloo pass where partitioning needs two); two gloo
ranks without a GPU. Facts are given as the facts worker reports them on such machines."""

from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.facts import Facts
from mgft_doctor.probes import zero3_model

H200 = {"index": 0, "name": "NVIDIA H200", "total_memory": 150_110_797_824, "capability": "9.0", "bf16": True}


def context(gpus: int, nproc: int | None = None) -> Context:
    ctx = Context(Options(nproc=nproc))
    devices = [dict(H200, index=i) for i in range(gpus)]
    ctx.__dict__["facts"] = Facts({"torch": "2.14.1", "cuda_available": bool(gpus), "device_count": gpus,
                                   "devices": devices, "nccl_available": bool(gpus)})
    return ctx


def test_ranks_follow_the_gpus():
    assert context(0).nproc == 2 and context(0).backend == "gloo"
    assert context(1).nproc == 1 and context(1).backend == "nccl"
    assert context(8).nproc == 8
    assert context(1, nproc=2).nproc == 2  # asked for: gpu.visible and nccl.allreduce report MGD102


def test_zero3_runs_on_the_gpus_and_adds_a_gloo_pass_on_one_gpu():
    assert zero3_model.plan_runs(context(0)) == [("gloo", 2)]
    assert zero3_model.plan_runs(context(1)) == [("nccl", 1), ("gloo", 2)]
    assert zero3_model.plan_runs(context(2)) == [("nccl", 2)]
    assert zero3_model.plan_runs(context(4)) == [("nccl", 4)]
    assert zero3_model.plan_runs(context(4, nproc=2)) == [("nccl", 2)]
