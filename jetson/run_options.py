"""What ``python3 -m jetson run`` is asked (:class:`RunOptions`, its choices) and what its exit code says.

Exit codes: 0 every variant done, 1 at least one variant failed (the others ran; see run.json),
2 bad usage or a bad bundle (nothing ran), 3 a bug in the runner, 128 + N when signal N
interrupted it (130: Ctrl-C), after putting the power mode and clocks back and marking the results
partial.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jetson.bundle import Bundle, Protocol
from jetson.engine import BUILDERS, PYTHON_BUILDER
from jetson.errors import JetsonError

BACKENDS = ("tensorrt", "ort")

ENERGY = ("auto", "on", "off")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


@dataclass(frozen=True)
class RunOptions:
    """What ``python3 -m jetson run`` was asked; None takes the bundle's protocol default."""

    bundle: Path
    out: Path | None = None
    backend: str = "tensorrt"
    warmup: int | None = None
    warmup_s: float | None = None
    iterations: int | None = None
    duration_s: float | None = None
    cuda_graph: bool | None = None
    idle_s: float | None = None
    energy: str = "auto"
    power_mode: str | None = None
    lock_clocks: bool = False
    variants: tuple[str, ...] = ()
    cache_dir: Path | None = None
    cuda: str | None = None
    threads: int | None = None
    layer_runs: int = 20
    force: bool = False
    nvpmodel_conf: Path | None = None  # None: the configuration nvpmodel reads (jetson.power.nvpmodel_conf_in_use)
    builder: str = PYTHON_BUILDER
    trtexec: str | None = None       # the trtexec binary (default: on PATH, else JetPack's)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise JetsonError(f"--backend {self.backend!r}", expected=f"one of {', '.join(BACKENDS)}")
        if self.builder not in BUILDERS:
            raise JetsonError(f"--builder {self.builder!r}", expected=f"one of {', '.join(BUILDERS)}")
        if self.builder != PYTHON_BUILDER and self.backend != "tensorrt":
            raise JetsonError(f"--builder {self.builder} with --backend {self.backend}",
                              expected="--builder only with --backend tensorrt (ONNX Runtime builds no engine)",
                              fix="leave out --builder, or run --backend tensorrt")
        if self.energy not in ENERGY:
            raise JetsonError(f"--energy {self.energy!r}", expected=f"one of {', '.join(ENERGY)}")

    def protocol(self, bundle: Bundle) -> Protocol:
        """The bundle's protocol with this run's overrides: --duration or --iterations is the whole timed window
        (--iterations without --duration drops the durations, the energy one too)."""
        base = bundle.protocol
        overrides: dict[str, Any] = {k: v for k, v in (("warmup", self.warmup), ("iterations", self.iterations),
                                                        ("cuda_graph", self.cuda_graph), ("idle_s", self.idle_s),
                                                        ("warmup_s", self.warmup_s))
                                     if v is not None}
        if self.duration_s is not None or self.iterations is not None:
            overrides["duration_s"] = self.duration_s
            overrides["energy_duration_s"] = None
        if self.duration_s is not None and self.iterations is None:
            overrides["iterations"] = 1
        return replace(base, **overrides)
