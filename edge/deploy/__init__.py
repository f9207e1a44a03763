"""``edge deploy``: a bundle (edge bundle) onto one or many Jetsons over SSH, the device runner run
there, results and logs fetched back into a folder.

``deploy(bundle, hosts, DeployConfig(...), out=FOLDER)`` returns one record per device. The
system's OpenSSH does the work (edge.deploy.ssh: host keys checked, every remote word quoted);
edge.deploy.device_deploy is one device's copy, run and fetch; edge.deploy.fleet runs devices in
parallel and shares engines between devices of one identity; edge.deploy.results reads a folder's fetched
results back as data (:func:`fetched_devices`) for whoever reports them: this package writes no
report and knows no pipeline run folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edge.deploy.device_deploy import RECORD, DeviceDeploy, RunnerOptions
from edge.deploy.fleet import deploy_fleet
from edge.deploy.results import FetchedDevice, fetched_devices
from edge.deploy.ssh import DeployError, Host, SshOptions, parse_host, read_hosts
from edge.errors import EdgeError, plural
from jetson.archive import ArchiveError, archive_files
from jetson.bundle import MANIFEST, Bundle, parse_manifest, read_bundle, verify_bundle
from jetson.errors import JetsonError

REMOTE_ROOT = "edge-bundles"  # the default remote folder, under the login user's home


@dataclass(frozen=True)
class DeployConfig:
    """How to reach the devices and what to run there. ``remote_dir`` None: ``edge-bundles/BUNDLE_NAME``."""

    ssh: SshOptions = field(default_factory=SshOptions)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    remote_dir: str | None = None
    remote_python: str = "python3"
    share_engines: bool = True
    # report each device's speed-up of edge's plugins: pairs NAME / NAME-plugins (edge.deploy.plugin_ratio)
    plugin_ratio: bool = False


ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def checked_source(path: str | Path) -> tuple[Bundle, Path | None]:
    """The bundle at ``path``, a folder or its ``.tar.gz`` (then also the archive's path), every file
    checked against its manifest here, before any device sees it. An archive is read without being
    unpacked; its members are checked as the device checks them again (jetson.archive): an absolute
    path, a ``..`` part, a link or a member outside its one folder is refused, naming the member."""
    path = Path(path)
    if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
        return _checked_archive(path), path
    if not path.is_dir():
        raise EdgeError(f"bundle {path} is neither a folder nor a .tar.gz",
                        expected="a folder written by `edge bundle --out`, or the .tar.gz of `edge bundle --tar`",
                        fix="pass the bundle folder or its archive")
    try:
        bundle = read_bundle(path)
        verify_bundle(bundle)
    except JetsonError as e:
        raise EdgeError(f"bundle {path}: {e.what}", expected=e.expected, found=e.found, fix=e.fix) from e
    return bundle, None


def _checked_archive(path: Path) -> Bundle:
    try:
        top, files, manifest, _ = archive_files(path)
    except ArchiveError as e:
        raise EdgeError(str(e), expected="an archive written by `edge bundle --tar`: one folder of files",
                        fix="make the archive again with `edge bundle --tar`; never unpack a refused one") from e
    if manifest is None:
        raise EdgeError(f"{path} is not a bundle: {top}/{MANIFEST} is missing",
                        expected="the .tar.gz of `edge bundle --tar`", fix="make it again with `edge bundle --tar`")
    try:
        bundle = parse_manifest(manifest, path.parent / top, f"{path}:{top}/{MANIFEST}")
        verify_bundle(bundle, files)
    except JetsonError as e:
        raise EdgeError(f"bundle {path}: {e.what}", expected=e.expected, found=e.found, fix=e.fix) from e
    return bundle


def remote_folder(config: DeployConfig, bundle: Bundle) -> str:
    folder = config.remote_dir or f"{REMOTE_ROOT}/{bundle.root.resolve().name}"
    folder = folder.removeprefix("~/")  # the login shell starts in the home folder; "~" is not expanded
    if not folder or folder in (".", "~", "/"):
        raise EdgeError(f"--remote-dir {config.remote_dir!r}", expected="a folder of its own for the bundle")
    return folder


def deploy(bundle_path: str | Path, hosts: list[Host], config: DeployConfig | None = None, *,
           out: str | Path | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Deploy to every host, each device's results fetched into ``out/LABEL`` (default: ``BUNDLE-devices``
    beside the bundle); their records (``failed`` lists the devices that did not finish)."""
    config = config or DeployConfig()
    progress = progress or (lambda message: None)
    bundle, archive = checked_source(bundle_path)
    if not hosts:
        raise EdgeError("no device given", fix="pass --host user@address (repeatable) or --hosts FILE")
    labels = [h.label for h in hosts]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise EdgeError(f"device {twice[0]} is named twice", fix="name each device once")
    if config.plugin_ratio:
        from edge.deploy.plugin_ratio import check_pairs

        check_pairs(bundle)
    out = Path(out) if out else bundle.root.parent / f"{bundle.root.name}-devices"
    remote_dir = remote_folder(config, bundle)
    devices = [DeviceDeploy(bundle, host, config.ssh, config.runner, remote_dir, config.remote_python,
                            out / host.label, progress, archive=archive) for host in hosts]
    progress(f"deploying {archive or bundle.root} ({plural(len(bundle.variants), 'variant')}) to "
             f"{len(devices)} device(s)")
    deploy_fleet(devices, share_engines=config.share_engines and config.runner.backend == "tensorrt")
    records = [d.record() for d in devices]
    summary = {"bundle": str(archive or bundle.root), "bundle_sha256": bundle.sha256, "out": str(out),
               "devices": records,
               "failed": [r["label"] for r in records if r["status"] != "ok"]}
    if config.plugin_ratio:
        from edge.deploy.plugin_ratio import plugin_ratios

        labels = set(labels)
        summary["plugin_ratio"] = {f.folder.name: plugin_ratios(bundle, f) for f in fetched_devices(out)
                                   if f.folder.name in labels}
    return summary


__all__ = ["RECORD", "DeployConfig", "DeployError", "FetchedDevice", "Host", "RunnerOptions", "SshOptions",
           "checked_source", "deploy", "fetched_devices", "parse_host", "read_hosts"]
