"""INT8 for ``edge quantize``: edge's options, its calibration images and cache, and calib's Q/DQ quantizer.

:mod:`calib.qdq` quantizes a graph on images it is handed; this module is edge's side of it: the
options (:class:`Int8Config`, bounded for the CLI), the images (the shared seeded, class-balanced
sampler: :mod:`edge.precision.calibration`), the cache folder, ONNX Runtime's log kept off the
terminal, calib's errors as :class:`~edge.errors.EdgeError`, and the precision recorded in the graph.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from calib.errors import CalibError
from calib.placement import PLACEMENTS
from calib.qdq import FLOAT_PRECISIONS, METHODS, Calibration, QdqConfig
from edge.config import MAX_SAMPLES, MAX_SEED, option
from edge.errors import EdgeError
from edge.onnx_metadata import CALIBRATION, QDQ_PLACEMENT, set_precision_metadata, source_precision


def default_cache_dir() -> Path:
    base = os.environ.get("EDGE_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "edge")
    return Path(base).expanduser() / "calibration"


@dataclass
class Int8Config:
    data: str | None = None   # None: the bundled model's data set (edge.models.data_for), else --data is needed
    samples: int = option(500, minimum=1, maximum=MAX_SAMPLES)
    seed: int = option(0, minimum=0, maximum=MAX_SEED)
    method: str = "minmax"          # minmax | entropy | percentile
    percentile: float = option(99.999, above=0, maximum=100)  # percentile method: the share of |x| kept
    entropy_bins: int = option(2048, minimum=2, maximum=1 << 20)  # entropy and percentile methods: histogram bins
    quantize_residual: bool = True  # Q/DQ on an input of residual Adds (which one: placement)
    placement: str = "linear-sq"    # linear-sq | linear | modelopt | skip (calib.placement; the choice:
                                    # docs/results/int8-placements.md)
    smoothquant_alpha: float = option(0.5, minimum=0, maximum=1)  # linear-sq: SmoothQuant's migration strength
    float_precision: str = "float16"  # what is not quantized: float16 (INT8+FP16) or float32 (INT8+FP32)
    exclude_nodes: tuple[str, ...] = ()
    cache_dir: str | None = None    # None: $EDGE_CACHE_DIR/calibration or ~/.cache/edge/calibration
    use_cache: bool = True

    def check(self) -> None:
        if self.method not in METHODS:
            raise EdgeError(f"calibration method {self.method!r} is unknown", expected=f"one of {', '.join(METHODS)}",
                            fix="pass --method minmax, entropy or percentile")
        if not 0 < self.percentile <= 100:
            raise EdgeError(f"percentile {self.percentile} is out of range", expected="0 < percentile <= 100")
        if self.samples < 1:
            raise EdgeError(f"--samples {self.samples}", expected="at least 1 calibration sample")
        if self.placement not in PLACEMENTS:
            raise EdgeError(f"Q/DQ placement {self.placement!r} is unknown", expected=f"one of {', '.join(PLACEMENTS)}",
                            fix=f"pass --placement {' or '.join(PLACEMENTS)}")
        if not 0 <= self.smoothquant_alpha <= 1:
            raise EdgeError(f"SmoothQuant alpha {self.smoothquant_alpha} is out of range", expected="0 <= alpha <= 1",
                            fix="0.5 is SmoothQuant's default")
        if self.float_precision not in FLOAT_PRECISIONS:
            raise EdgeError(f"float precision {self.float_precision!r} is unknown",
                            expected=f"one of {', '.join(FLOAT_PRECISIONS)}", fix="pass --unquantized fp16 or fp32")

    def qdq(self) -> QdqConfig:
        """How calib quantizes the graph (this config less the calibration data and cache)."""
        return QdqConfig(method=self.method, percentile=self.percentile, entropy_bins=self.entropy_bins,
                         quantize_residual=self.quantize_residual, placement=self.placement,
                         smoothquant_alpha=self.smoothquant_alpha,
                         float_precision=self.float_precision, exclude_nodes=tuple(self.exclude_nodes))

    def calibration_record(self) -> dict:
        """What identifies the calibration images: recorded in the graph and keyed in the cache."""
        return {"data": self.data, "samples": self.samples, "seed": self.seed}


def quantize_int8(model: onnx.ModelProto, source: str, config: Int8Config | None = None, progress=None,
                  head: frozenset[str] = frozenset()) -> tuple[onnx.ModelProto, dict]:
    """The Q/DQ int8 graph of ``model`` (float32) and a report (calibration, cache, structure).

    ``head``: the names of the classifier head's nodes (:func:`edge.precision.fp16.head_nodes`), which the
    ``linear``, ``linear-sq`` and ``modelopt`` placements leave unquantized.
    Everything not quantized is still float32 here; with ``config.float_precision="float16"`` the
    graph is at opset 19, ready for :func:`edge.precision.fp16.convert_to_fp16`.
    """
    from calib import qdq
    from edge.check.compare import ort_messages

    config = config or Int8Config()
    config.check()
    if source_precision(model) != "float32":
        raise EdgeError(f"{source} is a {source_precision(model)} graph", expected="the float32 graph from edge export",
                        fix="quantize the float32 export, not a converted one")
    try:
        calibration = _calibration(model, source, config, progress)
        quantized, report = qdq.quantize_int8(model, source, config.qdq(), calibration, head=head, quiet=ort_messages)
    except CalibError as e:
        raise EdgeError(e.what, expected=e.expected, found=e.found, fix=e.fix) from e
    smoothing = {"smoothquant_alpha": config.smoothquant_alpha} if config.placement == "linear-sq" else {}
    set_precision_metadata(quantized, "int8", **{CALIBRATION: json.dumps({**config.calibration_record(),
                                                                          "method": config.method, **smoothing}),
                                                 QDQ_PLACEMENT: config.placement})
    return quantized, {"precision": "int8", "format": "QDQ", "config": asdict(config),
                       "calibration": {"method": config.method, "samples": config.samples, "data": config.data,
                                       "seed": config.seed, **report.pop("calibration")}, **report}


def _calibration(model: onnx.ModelProto, source: str, config: Int8Config, progress) -> Calibration:
    """The shared sampler's images for calib (loaded only when its cache misses) and the cache folder."""
    def images() -> np.ndarray:
        from edge.precision.calibration import calibration_images

        array = calibration_images(model, source, config.data, config.samples, config.seed)
        if progress:
            progress(f"calibrating ({config.method}) on {config.samples} samples of {config.data}")
        return array

    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    return Calibration(images, config.calibration_record(), cache_dir if config.use_cache else None)
