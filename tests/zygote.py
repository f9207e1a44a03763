"""The zygote of tests/launch.py: a Python that has imported edge (torch, timm, ONNX; not ONNX Runtime) once and forks
a child for each ``edge`` command a test runs, so that no command pays the 3-5 s of imports a fresh interpreter
does on the 2-vCPU CI machine.

``python -m tests.zygote REQUEST_FD REPLY_FD``: it answers ``ready``, then for each request line (JSON: ``module``,
``argv``, ``cwd``, ``env``, ``stdout``, ``stderr``) forks, answers ``{"pid": N}``, waits for that child and answers
``{"status": S}`` (S as :attr:`subprocess.Popen.returncode`: the exit status, or minus the signal). The child is the
command's process: its own process group, the request's working folder, environment (set in full), ``argv``, stdout
and stderr files and ``/dev/null`` for stdin; it runs ``python -m MODULE`` as runpy does and exits with the status
``python -m MODULE ARGS`` would, after the atexit handlers and with its streams flushed.

The zygote computes nothing before it forks (no thread pool is started), so a fork is as safe as a fresh start.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import sys
import tempfile

# What the verbs import; each child finds them imported (a module that fails to import is left to the child).
# Not ONNX Runtime: importing it starts a thread, and a process with two threads cannot fork safely (a child
# imports it in 0.1 s).
PRELOAD = ("torch", "timm", "onnx", "edge.cli", "edge.models", "edge.export", "edge.compress.methods",
           "edge.compress.finetune", "edge.graph", "edge.precision.quantize", "edge.check.compare", "edge.data",
           "edge.analysis", "edge.train", "edge.planner", "edge.pipeline")
MODULES = ("edge", "tests.no_fmnist", "tests.launch_probe")   # what a request may run
ZYGOTE_PYTHONPATH = tuple(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))


def preload() -> None:
    from edge._compat import ensure_torchvision_importable

    ensure_torchvision_importable()   # before timm, as edge does
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:   # noqa: BLE001 - the child imports it again and reports what a fresh start would
            pass


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def child(request: dict) -> None:
    """Become the command's process and run it; never returns."""
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None                       # $TMPDIR as the request gives it
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # sys.path as `python -m` at this folder with this $PYTHONPATH would start: the folder, $PYTHONPATH, the rest
    rest = [p for p in sys.path[1:] if p not in ZYGOTE_PYTHONPATH]
    sys.path[:] = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), *rest]
    importlib.invalidate_caches()
    sys.argv = [sys.argv[0], *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as e:                       # as the interpreter reads sys.exit's argument
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:                         # noqa: BLE001 - an uncaught exception: its traceback, exit 1
        sys.excepthook(*sys.exc_info())
        status = 1
    # The interpreter's exit as multiprocessing's forked children do it: the atexit handlers, the streams flushed,
    # then _exit. Tearing the modules down as well would take 1.7 s of the 2.2 a short command takes, and its
    # only visible effect, a file that nothing closed flushed by its finaliser, is not something edge relies on.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF)


def serve(requests, replies) -> None:
    replies.write("ready\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        if request["module"] not in MODULES:
            replies.write(json.dumps({"error": f"module {request['module']!r} is not one of {MODULES}"}) + "\n")
            replies.flush()
            continue
        if threads() != 1:
            replies.write(json.dumps({"error": f"the zygote has {threads()} threads: a fork is not safe"}) + "\n")
            replies.flush()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


if __name__ == "__main__":
    preload()
    with os.fdopen(int(sys.argv[1]), "r") as requests, os.fdopen(int(sys.argv[2]), "w") as replies:
        serve(requests, replies)
