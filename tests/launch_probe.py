"""``python -m tests.launch_probe [ARGS]``: what tests/test_launch.py checks of a launched process, as JSON on
stdout (its folder, an environment variable, ``sys.path[0]``, what stdin gives, its process group), a line from an
atexit handler on stderr, exit status 7; with ``EDGE_PROBE_SLEEP=SECONDS``, it sleeps that long first."""

import atexit
import json
import os
import sys
import time

if __name__ == "__main__":
    time.sleep(float(os.environ.get("EDGE_PROBE_SLEEP", "0")))
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    print(json.dumps({"cwd": os.getcwd(), "probe": os.environ.get("EDGE_PROBE"), "path0": sys.path[0],
                      "stdin": sys.stdin.read(), "leader": os.getpgid(0) == os.getpid(), "argv": sys.argv[1:]}))
    sys.exit(7)
