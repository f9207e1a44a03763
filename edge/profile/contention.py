"""How much of the machine other processes used while we measured.

The load average cannot tell: it counts the measuring process's own threads, and it trails by a
minute. :class:`CpuContention` reads the machine's busy CPU time from ``/proc/stat`` and this
process's own CPU time (``os.times``, children included) at the start and end of a block; what
the machine spent beyond our own share is other work competing for the cores::

    with CpuContention() as contention:
        run_benchmark()
    contention.result()  # {"other_cpu_share": 0.003, "own_cpu_share": 0.97, "seconds": 12.1, ...}

``other_cpu_share`` is the fraction of all CPUs' time over the block that went to other
processes (0: a quiet machine; 0.5 on 2 CPUs: another process held one core throughout);
``stolen_cpu_share`` the part of it a virtual machine's host took (``steal``: the host ran another
guest while this one had work), which nothing inside the machine can stop. Where ``/proc/stat``
does not exist (not Linux) the shares are None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: above this share of the machine used by other processes, a latency figure is not a clean figure
BUSY_SHARE = 0.05


def _busy_seconds() -> tuple[float, float] | None:
    """All CPUs' busy seconds since boot, and of them the seconds stolen: a virtual machine's host ran something
    else while this machine had work for the CPU (``steal``)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuContention:
    def __init__(self) -> None:
        self._start: tuple[tuple[float, float] | None, float, float] | None = None
        self._end: tuple[tuple[float, float] | None, float, float] | None = None

    @staticmethod
    def _sample() -> tuple[tuple[float, float] | None, float, float]:
        return _busy_seconds(), _own_seconds(), time.monotonic()

    def __enter__(self) -> CpuContention:
        self._start, self._end = self._sample(), None
        return self

    def __exit__(self, *exc) -> None:
        self._end = self._sample()

    def result(self) -> dict:
        if self._start is None:
            from edge.errors import InternalError

            raise InternalError("CpuContention.result() called before its `with` block ran")
        end = self._end or self._sample()
        (busy0, own0, t0), (busy1, own1, t1) = self._start, end
        seconds, cpus = max(t1 - t0, 1e-9), os.cpu_count() or 1
        own = (own1 - own0) / (seconds * cpus)
        other = stolen = None
        if busy0 is not None and busy1 is not None:
            other = max(0.0, (busy1[0] - busy0[0]) / (seconds * cpus) - own)
            stolen = max(0.0, (busy1[1] - busy0[1]) / (seconds * cpus))
        return {"other_cpu_share": None if other is None else round(other, 4), "own_cpu_share": round(own, 4),
                "stolen_cpu_share": None if stolen is None else round(stolen, 4),
                "seconds": round(seconds, 3), "cpus": cpus,
                "busy": None if other is None else other > BUSY_SHARE,
                "method": "/proc/stat busy time minus this process's own CPU time (os.times); stolen: /proc/stat "
                          "steal (the VM's host ran something else), part of the other share"}
