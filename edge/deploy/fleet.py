"""Many devices at once: each in its own thread, a failing one recorded without stopping the others,
and with TensorRT an engine built on one device reused on every device of the same identity.

Engines are tied to the device identity (jetson.device.IDENTITY: TensorRT version, GPU, SM count,
memory, board). Each device's identity is read first, with the bundle's own code; devices that
share one form a group whose first device builds and benchmarks, then its engine cache entries
(``KEY.engine`` and its manifest, named by the results) are copied into the others' caches before
they run, where the runner finds them under the same key. The runner's manifest check still refuses
an entry built for another identity, so a wrong grouping can cost a rebuild, never a wrong engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath

from edge.deploy.device_deploy import DeviceDeploy
from edge.deploy.ssh import DeployError, remote_words

MAX_PARALLEL = 16


def _each(devices: Iterable, work: Callable) -> None:
    devices = list(devices)
    if not devices:
        return
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(devices))) as pool:
        list(pool.map(work, devices))


def deploy_fleet(devices: list[DeviceDeploy], *, share_engines: bool) -> None:
    """Deploy every device; with ``share_engines`` (TensorRT, more than one device) group them by identity."""
    if not share_engines or len(devices) < 2:
        _each(devices, lambda d: d.deploy())
        return
    _each(devices, _prepare)
    groups: dict[str, list[DeviceDeploy]] = {}
    for device in devices:
        if device.status != "failed":
            key = json.dumps(device.identity, sort_keys=True) if device.identity else device.host.label
            groups.setdefault(key, []).append(device)

    def run_group(group: list[DeviceDeploy]) -> None:
        leader, *followers = group
        # each copy is checked again under the folder lock (DeviceDeploy.folder_lock; it sends nothing when the
        # folder is as _prepare left it): the lock is held one step at a time, so two entries for one device's
        # folder cannot wait for each other
        leader.deploy()
        _each(followers, lambda f: f.deploy(before_run=lambda f: share(leader, f)))

    _each(groups.values(), run_group)


def _prepare(device: DeviceDeploy) -> None:
    try:
        with device.folder_lock():
            device.upload()
            device.probe()
    except DeployError as e:
        device.fail(e)
        device.write_record()


def share(leader: DeviceDeploy, follower: DeviceDeploy) -> None:
    """Copy the engine cache entries of the leader's results into the follower's cache (a failure
    only costs the follower a build of its own)."""
    engines = [PurePosixPath(data["engine"]["path"]) for entry in leader.results()["variants"].values()
               if (data := entry["data"]) and not data.get("partial") and data.get("engine")]
    if not engines or follower.cache_root is None:
        return
    names = [n for path in engines for n in (path.name, f"{path.name}.json")]
    try:
        packed = leader.connection.run(f"cd -- {remote_words(engines[0].parent)} && tar -cf - "
                                       f"{remote_words(*names)}")
        target = remote_words(f"{follower.cache_root}/engines")
        follower.connection.run(f"mkdir -p -- {target} && cd -- {target} && tar -xf -", stdin=packed.stdout)
    except DeployError as e:
        follower.say(f"could not copy the engines of {leader.host} ({e.what}): it builds its own")
        return
    follower.engines_received = [p.name for p in engines]
    follower.say(f"{len(engines)} engines from {leader.host} (same device identity) put in its cache")
