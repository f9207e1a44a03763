"""Many processes, one result: the few collective operations edge's statistics and training use.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) every process sees its own share of
the data; statistics that are sums (moments, covariances, Taylor weights, counts) are summed over
all processes with :func:`all_reduce_sum` before anything is derived from them, and only the
main process (:func:`is_main`) writes files. In a single process every function here is the
identity, so the code path is the same with one process or many.

``init()`` joins the process group torchrun describes (gloo on the CPU; with CUDA devices NCCL for
CUDA tensors and gloo still for CPU tensors, so statistics kept on the CPU reduce either way);
it is called once by the verbs that can run distributed. :func:`shard_of` gives a process its
share of a data set; :func:`merge_welford` combines per-process running means and squared
deviations exactly (Chan, Golub and LeVeque's pairwise formula, from all-reduced sums).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

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
    backend = "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return True


def local_device(device: torch.device) -> torch.device:
    """This process's device: under torchrun a bare ``cuda`` becomes ``cuda:LOCAL_RANK`` (one GPU each)."""
    if launched() and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def shutdown(synchronise: bool = True) -> bool:
    """Leave the process group this process joined; whether it was one of several (False: a no-op).

    ``synchronise`` (after a run that ended well on every process): wait at a barrier first, so that
    no process leaves while another still works (the main process writing its result). After an
    error the barrier is skipped: the other processes may never reach it. A process that returns
    True should then end with :func:`end_process`.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    several = active()
    if synchronise and several:
        dist.barrier()
    dist.destroy_process_group()
    return several


def end_process(status: int) -> NoReturn:
    """End this process now with ``status``, its output flushed, without the interpreter's finalisation.

    Why: a gloo worker thread releases the last collective's tensors a moment after the collective has
    completed, and releasing a tensor created in Python takes the GIL. If that moment falls in the
    interpreter's finalisation, taking the GIL ends the thread inside a C++ destructor and the process
    aborts ("terminate called without an active exception", SIGABRT), so torchrun reports a run that
    succeeded as failed. Measured with torch 2.13 and Python 3.11 under ``torchrun --nproc_per_node 2``:
    2 launches in 60 after :func:`shutdown` with its barrier, 1 in 6 without it, 0 in 120 ending here;
    the core dump shows ``ProcessGroupGloo::runLoop`` destroying an ``AsyncBarrierWork`` in ``take_gil``
    during ``Py_FinalizeEx``. Ending with ``os._exit`` leaves nothing to race: every file edge writes is
    closed by then and its temporary folders are removed by their context managers.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


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


def batch_rows(n: int) -> slice:
    """This process's rows of a global batch of ``n``: contiguous, sizes differing by at most one."""
    size, extra = divmod(n, world_size())
    start = rank() * size + min(rank(), extra)
    return slice(start, start + size + (rank() < extra))


def data_parallel(model: torch.nn.Module, device: torch.device, find_unused: bool = False) -> torch.nn.Module:
    """``model`` in DistributedDataParallel (gradients averaged over the processes in backward); itself in one.

    ``find_unused``: some steps leave trainable parameters without a gradient (dilution's attention
    at M = 0 is skipped); DDP then finds them by walking the autograd graph once per step instead of
    waiting for their gradients forever.
    """
    if not active():
        return model
    import warnings

    from torch.nn.parallel import DistributedDataParallel

    # A depthwise kernel [C, 1, k, k] gets its gradient with another (equally dense) stride on the size-1
    # axis than DDP's bucket view: DDP copies it and warns once per process; the result is the same.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=find_unused)


def shard_of(dataset):
    """This process's share of ``dataset`` (``shard(len(dataset))``, same name); the data set itself in one process.

    ``dataset`` is any of edge's image sets (``subset(indices, name)``); each process then sees a fixed,
    disjoint part, and together they see every item once.
    """
    if not active():
        return dataset
    return dataset.subset(torch.tensor(list(shard(len(dataset))), dtype=torch.int64), dataset.name)


def merge_welford(count: int, mean: torch.Tensor, m2: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Combine every process's ``(count, mean, M2)`` into those of all their samples (in place; float64).

    Sums only: ``N = sum n_p``, ``mean = sum n_p mean_p / N``, ``M2 = sum (M2_p + n_p (mean_p - mean)^2)``,
    which is exact (the pairwise update of Chan et al. applied to all processes at once).
    """
    if not active():
        return count, mean, m2
    total = all_reduce_count(count)
    if total == 0:
        return 0, mean, m2
    merged = all_reduce_sum(mean * count) / total
    m2.add_(count * (mean - merged) ** 2)
    all_reduce_sum(m2)
    mean.copy_(merged)
    return total, mean, m2
