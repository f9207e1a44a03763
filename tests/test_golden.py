"""Refactors change no behaviour: two plans give the recorded weights, graphs and outputs, on any x86 CPU.

``tests/golden/artifacts.json`` holds, per plan, what ``edge compress`` -> ``edge export`` -> ``edge clean``
gave when it was recorded (``EDGE_RECORD_GOLDEN=1 pytest tests/test_golden.py -m "slow or not slow"``):
the plan, costs and fit statistics, every weight tensor's shape and digest, each graph's structure
(opset, inputs, outputs, nodes with their attributes, initializer names and shapes), its initializers'
digests, and its logits on the first 16 images of the bundled test set.

Two promises, checked apart:

* **Across machines** (the recording was made on one CPU, the test runs on any x86 CPU): structure is
  compared exactly, floats with the tolerances below. A float64 least-squares fit takes other BLAS code
  paths on another CPU (Intel vs AMD, MKL vs OpenBLAS kernels), so weights and graphs differ in their last
  bits there; bytes are not compared with the recording.
* **On one machine** (determinism): two runs of the same commands give byte-identical weights, exported and
  cleaned ONNX.

Everything runs on the bundled model and the bundled 2,000-image data set, with relative paths (the ONNX
metadata records the source path as given).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import load_file

from tests.launch import run_edge

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "artifacts.json"
TEST_IMAGES = ROOT / "edge" / "data" / "fmnist_mini" / "t10k-images-idx3-ubyte.gz"
PLANS = {
    "linear-9-10": "linear:9-10",
    "dwconv-2-5": "dwconv:blocks=2+5:init=lsq",
}
IMAGES = 16

# Tolerances, and why. Measured on linear:9-10: the recording (AMD EPYC Zen 4, AVX-512) against a run forced
# onto other BLAS code paths (OPENBLAS_CORETYPE=Haswell MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2) differs in
# one tensor, the fitted map (36,025 of its 36,864 elements; largest 3.3e-8 of its norm, relative L2
# 1.0e-6, digest 2.1e-6 of the norm), and in logits by at most 1.9e-6 (largest |logit| 9.7). The bounds
# below leave 50x (digests) and 500x (logits) over that and still see one weight moved by 1e-4 of its
# tensor's norm.
DIGEST_RTOL = 1e-4    # of the tensor's L2 norm, for each digest component
LOGITS_ATOL = 1e-4
LOGITS_RTOL = 1e-4
# The kernel fit's R^2 and relative error come from y'y - 2w'Z'y + w'Z'Zw, which cancels to a few
# digits: they are compared to 0.02. Every other fit statistic to 1e-6 relative (a mean over many values
# sums in an order that depends on the BLAS path and thread count).
CANCELLING = ("r2_mean", "r2_min", "rel_error")
STATISTICS_RTOL = 1e-6


# --- producing ------------------------------------------------------------------------------------

def _edge(cwd: Path, *args: str, fresh: bool) -> None:
    env = {**os.environ, "EDGE_NO_PROGRESS": "1"}
    result = run_edge(list(args), cwd=cwd, env=env, timeout=600, fresh=fresh)
    assert result.returncode == 0, result.stderr


def _produce(cwd: Path, name: str, fresh: bool = False) -> dict[str, Path]:
    """Run the three commands in ``cwd`` (``fresh``: each in a fresh interpreter, with its own hash seed, not
    forked from tests/launch.py's zygote); the paths of what they wrote."""
    _edge(cwd, "compress", "fmnist-deit-tiny", "--plan", PLANS[name], "--data", "fmnist-mini", "--samples", "200",
          "--out", name, fresh=fresh)
    _edge(cwd, "export", name, "--out", f"{name}.onnx", fresh=fresh)
    _edge(cwd, "clean", f"{name}.onnx", "--out", f"{name}.clean.onnx", fresh=fresh)
    return {"folder": cwd / name, "weights": cwd / name / "model.safetensors", "onnx": cwd / f"{name}.onnx",
            "clean_onnx": cwd / f"{name}.clean.onnx"}


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """Each plan produced once per test module (the recording test and the determinism test share it)."""
    cache: dict[str, dict[str, Path]] = {}

    def get(name: str) -> dict[str, Path]:
        if name not in cache:
            cache[name] = _produce(tmp_path_factory.mktemp(name), name)
        return cache[name]
    return get


# --- describing what was produced -----------------------------------------------------------------

def digest(array: np.ndarray) -> list[float]:
    """A tensor in six float64 numbers on the scale of its L2 norm: sum / sqrt(n), sum of |x| / sqrt(n), the
    norm, max |x| and two fixed standard-normal projections. Each moves by about the L2 norm of a change, so
    ``max |digest - recorded| / norm`` is about the change's relative size (a change of one element by
    1e-4 of the norm is seen)."""
    x = np.asarray(array, dtype=np.float64).ravel()
    if not x.size:
        return [0.0] * 6
    root = np.sqrt(x.size)
    projections = np.random.default_rng(0).standard_normal((2, x.size))
    return [float(x.sum() / root), float(np.abs(x).sum() / root), float(np.sqrt((x * x).sum())),
            float(np.abs(x).max()), *map(float, projections @ x)]


def _attribute(attribute: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, onnx.TensorProto):
        array = numpy_helper.to_array(value)
        return {"tensor": list(array.shape), "dtype": str(array.dtype), "digest": digest(array)}
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def _value_info(info: onnx.ValueInfoProto) -> list:
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim]
    return [info.name, info.type.tensor_type.elem_type, dims]


def graph_record(path: Path) -> dict:
    model = onnx.load(path)
    graph = model.graph
    return {
        "ir_version": model.ir_version,
        "opsets": {o.domain: o.version for o in model.opset_import},
        "metadata": {p.key: p.value for p in model.metadata_props},
        "inputs": [_value_info(i) for i in graph.input],
        "outputs": [_value_info(o) for o in graph.output],
        "nodes": [{"op": n.op_type, "name": n.name, "domain": n.domain, "inputs": list(n.input),
                   "outputs": list(n.output), "attributes": {a.name: _attribute(a) for a in n.attribute}}
                  for n in graph.node],
        "initializers": {i.name: {"shape": list(i.dims), "dtype": i.data_type, "digest": digest(numpy_helper.to_array(i))}
                         for i in graph.initializer},
        "logits": logits(path).tolist(),
    }


def bundled_images() -> np.ndarray:
    """The first IMAGES images of the bundled test set, as uint8 [n, 28, 28] (IDX: 16-byte header)."""
    with gzip.open(TEST_IMAGES) as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8, offset=16)
    return raw[: IMAGES * 28 * 28].reshape(IMAGES, 28, 28)


def logits(path: Path) -> np.ndarray:
    """The graph's outputs for the test images, normalised with the mean and std its metadata records."""
    import onnxruntime as ort

    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    mean, std = np.float32(json.loads(meta["edge.mean"])[0]), np.float32(json.loads(meta["edge.std"])[0])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    images = (bundled_images().astype(np.float32) / 255.0 - mean) / std
    return np.concatenate([session.run(None, {feed: image[None, None]})[0] for image in images])


def record(paths: dict[str, Path]) -> dict:
    manifest = json.loads((paths["folder"] / "edge-model.json").read_text())
    weights = load_file(paths["weights"])
    return {
        "plan": manifest["plan"],
        "before": manifest["before"],
        "after": manifest["after"],
        "fit": manifest["fit"],
        "weights": {k: {"shape": list(v.shape), "dtype": str(v.dtype), "digest": digest(v)}
                    for k, v in sorted(weights.items())},
        "onnx": graph_record(paths["onnx"]),
        "clean_onnx": graph_record(paths["clean_onnx"]),
    }


# --- comparing ------------------------------------------------------------------------------------

def assert_close_digest(got: list[float], want: list[float], where: str) -> None:
    scale = max(abs(want[2]), 1e-12)  # the norm
    error = max(abs(g - w) for g, w in zip(got, want)) / scale
    assert error <= DIGEST_RTOL, f"{where}: digest differs by {error:.2e} of the norm (allowed {DIGEST_RTOL:g})"


def assert_same_tensors(got: dict, want: dict, where: str) -> None:
    assert sorted(got) == sorted(want), f"{where}: other tensor names"
    for name in want:
        assert got[name]["shape"] == want[name]["shape"], f"{where}.{name}: shape"
        assert got[name]["dtype"] == want[name]["dtype"], f"{where}.{name}: dtype"
        assert_close_digest(got[name]["digest"], want[name]["digest"], f"{where}.{name}")


def assert_same_attribute(got, want, where: str) -> None:
    if isinstance(want, dict):  # a tensor attribute (a Constant node's value)
        assert got["tensor"] == want["tensor"] and got["dtype"] == want["dtype"], where
        assert_close_digest(got["digest"], want["digest"], where)
    elif isinstance(want, float) or (isinstance(want, list) and any(isinstance(v, float) for v in want)):
        assert got == pytest.approx(want, rel=1e-6), where
    else:
        assert got == want, where


def assert_same_graph(got: dict, want: dict, where: str) -> None:
    for key in ("ir_version", "opsets", "metadata", "inputs", "outputs"):
        assert got[key] == want[key], f"{where}: {key}"
    assert [n["op"] for n in got["nodes"]] == [n["op"] for n in want["nodes"]], f"{where}: other operators"
    for g, w in zip(got["nodes"], want["nodes"]):
        node = f"{where}: node {w['name']}"
        assert {k: g[k] for k in ("name", "domain", "inputs", "outputs")} == \
            {k: w[k] for k in ("name", "domain", "inputs", "outputs")}, node
        assert sorted(g["attributes"]) == sorted(w["attributes"]), f"{node}: attributes"
        for key in w["attributes"]:
            assert_same_attribute(g["attributes"][key], w["attributes"][key], f"{node}.{key}")
    assert_same_tensors(got["initializers"], want["initializers"], f"{where}.initializers")
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=LOGITS_RTOL, atol=LOGITS_ATOL,
                               err_msg=f"{where}: logits on {IMAGES} test images")


def assert_same_statistics(got, want, where: str = "fit") -> None:
    assert type(got) is type(want), where
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for key in want:
            assert_same_statistics(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_statistics(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and where.rsplit(".", 1)[-1] in CANCELLING and ".dwconv." in where:
        assert got == pytest.approx(want, abs=0.02), where
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=STATISTICS_RTOL, abs=1e-12), where
    else:
        assert got == want, where


def assert_matches_recording(got: dict, want: dict) -> None:
    for key in ("plan", "before", "after"):
        assert got[key] == want[key], key
    assert_same_statistics(got["fit"], want["fit"])
    assert_same_tensors(got["weights"], want["weights"], "weights")
    assert_same_graph(got["onnx"], want["onnx"], "onnx")
    assert_same_graph(got["clean_onnx"], want["clean_onnx"], "clean_onnx")


def _rounded(value):
    """Floats to 9 significant digits: far below every tolerance above, and a third of the file."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _dump(value, depth: int, indent: str = "") -> str:
    """JSON with containers opened down to ``depth`` levels, one entry a line below that."""
    if depth == 0 or not isinstance(value, (dict, list)) or not value:
        return json.dumps(value, sort_keys=True)
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_dump(v, depth - 1, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    return "[\n" + ",\n".join(inner + _dump(v, depth - 1, inner) for v in value) + f"\n{indent}]"


def write_recording(recorded: dict) -> None:
    """A node, a tensor, a statistic a line, so that a re-recording reads as a diff."""
    GOLDEN.write_text(_dump(_rounded(recorded), depth=4) + "\n")


# --- the tests ------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# CI time: the dwconv recording with -m slow (the linear one keeps the regression guard in the default run)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("dwconv") else n
                                  for n in sorted(PLANS)])
def test_artifacts_and_graphs_match_the_recording(name, produced):
    got = record(produced(name))
    if os.environ.get("EDGE_RECORD_GOLDEN"):
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        recorded[name] = got
        write_recording(recorded)
    assert_matches_recording(got, json.loads(GOLDEN.read_text())[name])


def test_two_runs_on_one_machine_give_the_same_bytes(produced, tmp_path):
    first = produced("linear-9-10")
    second = _produce(tmp_path, "linear-9-10", fresh=True)   # the first forked, this one fresh: other hash seeds
    for key in ("weights", "onnx", "clean_onnx"):
        assert _sha256(second[key]) == _sha256(first[key]), f"{key}: another run on this machine wrote other bytes"


# --- the comparison itself can fail ---------------------------------------------------------------

def _tiny_recording() -> dict:
    w = np.linspace(-1, 1, 64, dtype=np.float32)
    return {"shape": [64], "dtype": "float32", "digest": digest(w)}, w


def test_a_changed_weight_fails_the_comparison():
    entry, w = _tiny_recording()
    assert_same_tensors({"w": dict(entry)}, {"w": entry}, "weights")  # equal passes
    w2 = w.copy()
    w2[17] += 0.01  # a change of 1e-3 of the norm in one element
    with pytest.raises(AssertionError, match="digest differs"):
        assert_same_tensors({"w": {**entry, "digest": digest(w2)}}, {"w": entry}, "weights")


def test_last_bit_differences_pass_the_comparison():
    entry, w = _tiny_recording()
    nudged = np.nextafter(w, np.float32(np.inf))  # every element one float32 ulp up
    assert_same_tensors({"w": {**entry, "digest": digest(nudged)}}, {"w": entry}, "weights")
