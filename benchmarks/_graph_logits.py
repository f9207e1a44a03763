"""The Fashion-MNIST test split as a graph reads it, and a graph's logits on it, saved beside the graph
(the precision benchmarks: quant_peers.py, int8_placements.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def test_split(clean: Path):
    """The whole Fashion-MNIST test split, preprocessed as the graph's metadata says, and its labels."""
    import onnx

    from edge.data import ArrayPreprocess, load_dataset
    from edge.precision.calibration import input_spec_of

    data = load_dataset("fmnist", "test")
    spec = input_spec_of(onnx.load(str(clean), load_external_data=False), str(clean))
    return ArrayPreprocess(spec)(data.images).numpy(), data.labels.numpy()


def logits_of(path: Path, x, threads: int, batch: int, spinning: bool = True):
    """The graph's logits on ``x``, ``batch`` images a call; kept beside the graph under its sha256 (resumable).
    ``spinning=False`` where other processes share the cores (no spinning pool threads)."""
    import numpy as np

    from edge.check.compare import ort_session

    saved = path.with_name(f"{path.stem}.{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}.logits.npy")
    if saved.is_file():
        return np.load(saved)
    session = ort_session(str(path), threads, spinning=spinning)
    name = session.get_inputs()[0].name
    logits = np.concatenate([session.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)])
    np.save(saved, logits.astype(np.float64))
    return logits.astype(np.float64)
