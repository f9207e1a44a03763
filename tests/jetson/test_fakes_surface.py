"""The fakes held to the real APIs they stand in for (issue 29: fakes written from the same understanding as
the code agree with the code where both are wrong).

- FakeCudaRuntime (tests/fake_cuda.py) and the two bindings that speak cuda-python's conventions
  (jetson.cudart.CtypesCudaRuntime, jetson.cuda.PycudaRuntime) against the real cuda-python runtime module
  (``cuda.bindings.runtime``), where it is installed: every function edge calls exists there with the same
  number of parameters, the enums edge uses have the same values, and the calls that need no GPU answer in
  the same shape. Skipped with the reason where cuda-python is absent.
- The fake pycuda (tests/fake_pycuda.py) against the facts of pycuda's ``wrap_cudadrv.cpp`` written into
  it (:data:`tests.fake_pycuda.REAL_SURFACE`), and against the real pycuda where it imports (it needs a CUDA
  driver, ``libcuda``: absent on machines without a GPU).
- The fake libcudart (tests/jetson/fake_libcudart.c), which the ctypes binding is tested against, against
  the CUDA toolkit's ``cuda_runtime_api.h`` where one is installed: every entry point declared, with the
  same number of parameters.
- FakeTensorRT (tests/fake_tensorrt.py) against tensorrt-stubs 10.13: it declares no module attribute,
  class or member that the stubs lack (its own records aside).
"""

import ast
import glob
import inspect
import re
import sys
import types
from collections import defaultdict
from pathlib import Path

import pytest

from jetson.cuda import PycudaRuntime, check, load_cuda_runtime
from jetson.cudart import CtypesCudaRuntime
from tests.fake_cuda import FakeCudaRuntime, cudaError_t
from tests.fake_pycuda import REAL_SURFACE, fake_pycuda_driver
from tests.fake_tensorrt import FAKE_RECORDS, make_fake_tensorrt

#: every cuda-python runtime call edge makes (jetson.cuda, jetson.device, jetson.trt_backend, edge.trt)
EDGE_CALLS = ("cudaRuntimeGetVersion", "cudaDriverGetVersion", "cudaGetDeviceCount", "cudaGetDeviceProperties",
              "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaStreamCreate", "cudaStreamDestroy",
              "cudaStreamSynchronize", "cudaEventCreate", "cudaEventDestroy", "cudaEventRecord",
              "cudaEventElapsedTime", "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
              "cudaGraphLaunch", "cudaGraphDestroy", "cudaGraphExecDestroy", "getLocalRuntimeVersion")
#: the enums edge uses by member name
EDGE_ENUMS = ("cudaMemcpyKind", "cudaStreamCaptureMode")
#: what PycudaRuntime does not offer, by design (it says so: ``captures_graphs = False``)
PYCUDA_LACKS = ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate", "cudaGraphLaunch",
                "cudaGraphDestroy", "cudaGraphExecDestroy", "getLocalRuntimeVersion")
BINDINGS = {"FakeCudaRuntime": FakeCudaRuntime, "CtypesCudaRuntime": CtypesCudaRuntime,
            "PycudaRuntime": PycudaRuntime}


def real_cuda_python() -> types.ModuleType:
    return pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed here: `pip install "
                               "'cuda-python>=12.6,<13'` to hold the fakes to it")


def parameters(function) -> int:
    return len([p for p in inspect.signature(function).parameters.values() if p.name != "self"])


def calls_of(name: str) -> tuple[str, ...]:
    return tuple(c for c in EDGE_CALLS if not (name == "PycudaRuntime" and c in PYCUDA_LACKS))


@pytest.mark.parametrize("name", BINDINGS)
def test_each_binding_has_every_call_edge_makes(name):
    binding = BINDINGS[name]
    assert [c for c in calls_of(name) if not callable(getattr(binding, c, None))] == []


@pytest.mark.parametrize("name", BINDINGS)
def test_each_binding_takes_the_parameters_cuda_python_takes(name):
    real = real_cuda_python()
    binding = BINDINGS[name]
    differing = {c: (parameters(getattr(binding, c)), parameters(getattr(real, c))) for c in calls_of(name)
                 if parameters(getattr(binding, c)) != parameters(getattr(real, c))}
    assert differing == {}, "call: (parameters here, in cuda-python)"


def test_the_fake_enums_have_cuda_pythons_values():
    real = real_cuda_python()
    for enum_name in EDGE_ENUMS:
        for member in getattr(FakeCudaRuntime, enum_name):
            assert getattr(getattr(real, enum_name), member.name).value == member.value, f"{enum_name}.{member.name}"
    for member in cudaError_t:
        assert getattr(real.cudaError_t, member.name).value == member.value, f"cudaError_t.{member.name}"


def test_calls_that_need_no_gpu_answer_in_the_same_shape():
    """Without a driver, cuda-python 12.x answers cudaGetDeviceCount with (cudaErrorInsufficientDriver, None): the
    fake's answer when its runtime is newer than its driver; cudaRuntimeGetVersion needs no driver."""
    real = real_cuda_python()
    fake = FakeCudaRuntime()
    version = real.cudaRuntimeGetVersion()
    assert isinstance(version, tuple) and len(version) == len(fake.cudaRuntimeGetVersion()) == 2
    assert int(version[0]) == 0 and version[1] >= 12000
    error, count = real.cudaGetDeviceCount()
    if int(error) == 0:
        pytest.skip(f"this machine has {count} GPU(s): the no-driver answer cannot be seen")
    assert (error.name, count) == ("cudaErrorInsufficientDriver", None)
    too_new = FakeCudaRuntime(runtime=13000, driver=12060).cudaGetDeviceCount()
    assert (too_new[0].name, too_new[1]) == (error.name, count)


def test_the_real_cuda_python_without_a_gpu_is_skipped_by_the_probe(monkeypatch):
    """What jetson.cuda's probe (issue 29 D8) does with the real module on a machine without a usable driver."""
    real_cuda_python()
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setattr("jetson.cudart.LIBRARY_NAMES", ("/nonexistent/libcudart.so",))
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    error, _ = sys.modules["cuda.bindings.runtime"].cudaGetDeviceCount()
    if int(error) == 0:
        pytest.skip("this machine has a GPU")
    heard = []
    with pytest.raises(Exception, match="no CUDA runtime binding answered"):
        load_cuda_runtime(log=heard.append)
    assert "CUDA binding cuda-python skipped: CUDA call cudaGetDeviceCount failed (cudaErrorInsufficientDriver" \
        in heard[0]


# pycuda

def recorded_driver() -> tuple[object, dict[str, set[str]]]:
    """The fake pycuda driver behind a recorder: the public names PycudaRuntime uses, per class (on the class
    or its instances) and on the module ("module")."""
    driver = fake_pycuda_driver()
    used: dict[str, set[str]] = defaultdict(set)

    def note(kind: str, name: str) -> None:
        if not name.startswith("_"):
            used[kind].add(name)

    class RecordingType(type):
        def __getattribute__(cls, name):
            note(type.__getattribute__(cls, "__name__"), name)
            return super().__getattribute__(name)

    def recording(cls):
        def instance_getattribute(self, name):
            note(cls.__name__, name)
            return cls.__getattribute__(self, name)
        return RecordingType(cls.__name__, (cls,), {"__getattribute__": instance_getattribute})

    classes = {name: recording(getattr(driver, name)) for name in ("Stream", "Event", "Device")}

    class Module:
        def __getattribute__(self, name):
            note("module", name)
            return classes.get(name) or getattr(driver, name)

    return Module(), used


def test_pycuda_runtime_uses_only_what_wrap_cudadrv_binds(monkeypatch):
    proxy, used = recorded_driver()
    package = types.ModuleType("pycuda")
    package.driver = proxy
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", proxy)
    cuda = PycudaRuntime()
    check(cuda.cudaGetDeviceCount(), "cudaGetDeviceCount")
    check(cuda.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    stream = check(cuda.cudaStreamCreate(), "cudaStreamCreate")
    start, end = check(cuda.cudaEventCreate(), "cudaEventCreate"), check(cuda.cudaEventCreate(), "cudaEventCreate")
    for event in (start, end):
        check(cuda.cudaEventRecord(event, stream), "cudaEventRecord")
    check(cuda.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")
    check(cuda.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    cuda.close()
    for kind in ("Stream", "Event", "Device", "module"):
        outside = used[kind] - set(REAL_SURFACE[kind]["present"])
        assert outside == set(), f"PycudaRuntime uses {kind}.{sorted(outside)}, which wrap_cudadrv.cpp does not bind"
    assert "Event" in used and used["Event"] >= {"record", "time_since"}


@pytest.mark.parametrize("kind", ["Stream", "Event", "Device"])
def test_the_fake_pycuda_has_exactly_the_source_facts(kind):
    cls = getattr(fake_pycuda_driver(), kind)
    instance = cls(0) if kind == "Device" else cls()
    assert [n for n in REAL_SURFACE[kind]["present"] if not hasattr(instance, n)] == []
    assert [n for n in REAL_SURFACE[kind]["absent"] if hasattr(instance, n)] == []


def test_the_source_facts_hold_for_the_real_pycuda():
    driver = pytest.importorskip("pycuda.driver", reason="pycuda does not import here (it needs the CUDA "
                                 "driver, libcuda): the fake is held to wrap_cudadrv.cpp's facts instead",
                                 exc_type=ImportError)
    for kind in ("Stream", "Event", "Device"):
        cls = getattr(driver, kind)
        assert [n for n in REAL_SURFACE[kind]["present"] if not hasattr(cls, n)] == []
        assert [n for n in REAL_SURFACE[kind]["absent"] if hasattr(cls, n)] == []
    assert [n for n in REAL_SURFACE["module"]["present"] if not hasattr(driver, n)] == []


# TensorRT: the fake against tensorrt-stubs 10.13 (TensorRT's libraries cannot install here; the stubs are
# generated from the real bindings and are what mypy checks edge's calls against)

STUBS = Path(__file__).resolve().parents[2] / ".venv" / "tensorrt-stubs"


def stub_names() -> tuple[set[str], dict[str, set[str]]]:
    """The names tensorrt-stubs declares: at module level, and per class."""
    sources = [STUBS / "tensorrt_bindings" / "tensorrt.pyi", STUBS / "tensorrt" / "__init__.pyi"]
    if not all(p.is_file() for p in sources):
        pytest.skip(f"tensorrt-stubs are not installed in {STUBS} (scripts/mypy.sh installs them)")
    module: set[str] = set()
    classes: dict[str, set[str]] = {}
    for source in sources:
        for node in ast.parse(source.read_text()).body:
            module.update(declared(node))
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(n for child in node.body for n in declared(child))
    return module, classes


def declared(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.ImportFrom):
        return {alias.asname or alias.name for alias in node.names}
    return set()


@pytest.mark.parametrize("feature_set", ["10.3", "11.0"])
def test_the_fake_tensorrt_declares_nothing_the_stubs_lack(feature_set):
    module_names, classes = stub_names()
    fake = make_fake_tensorrt(feature_set)
    public = {name: value for name, value in vars(fake).items() if not name.startswith("_") and
              name not in FAKE_RECORDS}
    assert sorted(set(public) - module_names) == []
    extra = {name: sorted({k for k in vars(value) if not k.startswith("_")} - classes[name])
             for name, value in public.items() if isinstance(value, type) and name in classes}
    assert {name: names for name, names in extra.items() if names} == {}


# the fake libcudart against the CUDA toolkit's header

FAKE_LIBCUDART = Path(__file__).with_name("fake_libcudart.c")


def parameter_count(arguments: str) -> int:
    arguments = re.sub(r"__dv\([^)]*\)", "", arguments).strip()  # C++ default arguments
    return 0 if arguments in ("", "void") else arguments.count(",") + 1


def test_the_fake_libcudart_has_the_signatures_of_cuda_runtime_api_h():
    headers = sorted(glob.glob("/usr/local/cuda*/include/cuda_runtime_api.h"))
    if not headers:
        pytest.skip("no CUDA toolkit here (/usr/local/cuda*/include/cuda_runtime_api.h)")
    text = Path(headers[0]).read_text()
    declared = {m.group(1): parameter_count(m.group(2))
                for m in re.finditer(r"CUDARTAPI\s+(cuda\w+)\s*\(([^;]*?)\)\s*;", text, re.S)}
    fake = {m.group(1): parameter_count(m.group(2)) for m in re.finditer(
        r"^(?:cudaError_t|const char \*)\s*(cuda\w+)\(([^)]*)\)", FAKE_LIBCUDART.read_text(), re.M)}
    assert len(fake) >= 20
    differing = {name: (count, declared.get(name, declared.get(name.removesuffix("_v2"))))
                 for name, count in fake.items()
                 if declared.get(name, declared.get(name.removesuffix("_v2"))) != count}
    assert differing == {}, f"entry point: (parameters in the fake, in {headers[0]})"
