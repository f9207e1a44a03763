"""Many processes, one result: the few collective operations edge's statistics and training use.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) every process sees its own share of
the data; statistics that are sums (moments, covariances, Taylor weights, counts) are summed over
all processes with :func:`all_reduce_sum` before anything is derived from them, and only the
main process (:func:`is_main`) writes files. In a single process every function here is the
identity, so the code path is the same with one process or many.

``init()`` joins the process group torchrun describes (gloo on the CPU, NCCL on CUDA devices);
it is called once by the verbs that can run distributed.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether this process was started by torchrun (or any launcher) as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def active() -> bool:
    """Whether a process group of more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """The one process that writes results (rank 0; the only process when not distributed)."""
    return rank() == 0


def init(device: torch.device | str = "cpu") -> bool:
    """Join torchrun's process group if launched as one of several; return whether distributed."""
    if not launched() or active():
        return active()
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return True


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all processes, in place, and return it (unchanged in one process)."""
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_count(count: int) -> int:
    """Sum an integer count over all processes (exact: int64)."""
    if not active():
        return count
    value = torch.tensor([count], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return int(value.item())


def barrier() -> None:
    if active():
        dist.barrier()


def shard(n: int) -> range:
    """This process's share of ``n`` items in a fixed order: every ``world_size()``-th from ``rank()``."""
    return range(rank(), n, world_size())
