"""``edge deploy``: a bundle onto Jetsons over SSH, benchmarked there, results fetched and, with --report,
handed to the pipeline's report writer (edge.deploy knows no run folder; edge.pipeline writes its report)."""

from __future__ import annotations

from edge.cli.common import add_command, emit
from edge.cli.options import (
    ExistingFile,
    ExistingFolder,
    ExistingPath,
    Model,
    Number,
    OutputFile,
    OutputFolder,
    Text,
    config_type,
)
from edge.config import Bounds

EXAMPLES = """  edge deploy bundles/demo --host nvidia@192.168.1.20      # TensorRT; results in bundles/demo-devices
  edge deploy bundles/demo --host nvidia@jetson --power-mode 15W --lock-clocks --report runs/demo
  edge deploy bundles/demo --hosts fleet.txt --identity ~/.ssh/jetson_ed25519 --report runs/demo
  edge deploy bundles/demo --host nvidia@new-board --accept-new-host-key --backend ort
  edge deploy bundles/demo.tar.gz --host nvidia@jetson --builder trtexec   # unpacked on the device
  edge deploy --latency-table fmnist-deit-tiny --host nvidia@jetson --power-mode MAXN_SUPER --out tables/nano
  edge deploy --check --host nvidia@jetson --power-mode 15W --lock-clocks     # is the device ready? nothing copied"""


def register(subparsers) -> None:
    from edge.deploy.ssh import SshOptions, parse_host
    from edge.latency.device_table import PRECISIONS as LATENCY_PRECISIONS
    from edge.latency.device_table import DeviceTableConfig
    from edge.latency.grid import GRIDS, GridConfig

    parser = add_command(
        subparsers, "deploy", "deploy a bundle to Jetsons over SSH: copy, build and benchmark there, fetch results",
        "Copies the bundle (files already on the device with the same sha256 are kept), runs `python3 -m jetson\n"
        "run` in it, fetches results and logs back (also after a failure) into OUT/USER@HOST_PORT/, and with\n"
        "--report merges them into the pipeline run's report (report.json/md/html: a device section). Uses the\n"
        "system's OpenSSH; host keys are checked (a new device needs --accept-new-host-key once), nothing\n"
        "prompts. A fleet (--host repeated, or --hosts) is deployed in parallel; a device that fails does not\n"
        "stop the others, and an engine built on one device is reused on those of the same identity.\n"
        "--latency-table MODEL: instead of a bundle, the latency grid of MODEL's parts (edge.latency) is\n"
        "bundled, run there, and each device's table written to OUT/devices/LABEL/latency-table.json.\n"
        "Results that come back are checked before anything is written: a link, a name outside results/ or\n"
        "malformed JSON is refused (exit 2, the file named). Each failed device's error (the device's own\n"
        "message) is printed on stderr.\n"
        "Exit status: 0 every device done, 1 some device failed (the summary names it), 2 bad input or\n"
        "refused results.", EXAMPLES)
    parser.add_argument("bundle", nargs="?", type=ExistingPath(),
                        help="a bundle folder written by `edge bundle`, or its .tar.gz (--tar): copied "
                             "whole and unpacked on the device, after its members are checked here")
    parser.add_argument("--host", action="append", default=[], metavar="USER@ADDR[:PORT]",
                        type=Text(parse_host, keep_text=True), help="a device (repeatable)")
    parser.add_argument("--hosts", metavar="FILE", type=ExistingFile(),
                        help="devices, one USER@ADDR[:PORT] a line (# comments)")
    parser.add_argument("--port", type=Number(int, Bounds(minimum=1, maximum=65535), "--port"),
                        help="SSH port of devices that name none (default: ssh's, 22)")
    parser.add_argument("--identity", type=ExistingFile(), help="SSH private key (default: ssh's own keys and agent)")
    parser.add_argument("--known-hosts", type=OutputFile(),
                        help="a known_hosts file to use instead of ~/.ssh/known_hosts")
    parser.add_argument("--accept-new-host-key", action="store_true",
                        help="record the host key of a device seen for the first time (a changed key is always "
                             "refused)")
    parser.add_argument("--connect-timeout", type=config_type(SshOptions, "--connect-timeout", "connect_timeout_s"),
                        default=SshOptions.connect_timeout_s, metavar="S",
                        help="seconds to wait for a device to answer")
    parser.add_argument("--backend", choices=("tensorrt", "ort"), default="tensorrt",
                        help="ort: the same protocol on ONNX Runtime (where TensorRT is absent)")
    parser.add_argument("--builder", choices=("python", "trtexec"), default="python",
                        help="TensorRT: who builds the engines on the device: python (TensorRT's Python API, "
                             "default: applies the bundle's tactic-DRAM cap) or trtexec (its output fetched with the "
                             "logs; it has no tactic-DRAM pool, so the cap is not applied)")
    parser.add_argument("--power-mode", type=Text(),
                        help="nvpmodel mode by name for the run (e.g. 15W), put back after")
    parser.add_argument("--lock-clocks", action="store_true", help="jetson_clocks for the run, restored after")
    parser.add_argument("--nvpmodel-conf", type=Text(),
                        help="the device's nvpmodel configuration (default: the one nvpmodel reads there, as "
                             "`nvpmodel -q --verbose` names it; else /etc/nvpmodel.conf)")
    parser.add_argument("--remote-dir", type=Text(),
                        help="the bundle's folder on the device (default: edge-bundles/NAME in "
                                             "the login user's home)")
    parser.add_argument("--remote-python", type=Text(), default="python3", help="the device's Python")
    parser.add_argument("--out", type=OutputFolder(),
                        help="local folder for the results (default: RUN_DIR/device with --report, "
                                      "else BUNDLE-devices)")
    parser.add_argument("--report", metavar="RUN_DIR", type=ExistingFolder(),
                        help="a pipeline run folder whose report gains the device "
                                                             "results")
    parser.add_argument("--plugin-ratio", action="store_true",
                        help="report each device's speed-up of edge's TensorRT plugins: the bundle holds variants "
                             "NAME and NAME-plugins (the same model after `edge clean --plugins`); the device builds "
                             "and times both, and the summary's plugin_ratio gives median without / with per pair")
    parser.add_argument("--check", action="store_true",
                        help="only check each device, copying and building nothing: SSH, Python, L4T/JetPack, "
                             "TensorRT, the CUDA binding, sudo rights for --power-mode/--lock-clocks, tegrastats, "
                             "power modes, memory, swap, disk, CMA; exit 1 when a check fails (its fix is printed)")
    parser.add_argument("--latency-table", metavar="MODEL", type=Model(),
                        help="time the parts of this model (name or compressed artifact) on the devices instead of "
                             "a bundle: one latency table per device")
    parser.add_argument("--grid", choices=GRIDS, default=GridConfig.grid,
                        help="--latency-table: the model's own parts, or every part a plan on it can make")
    parser.add_argument("--batch", type=config_type(GridConfig, "--batch"), default=GridConfig.batch,
                        help="--latency-table: the static batch of the part graphs")
    parser.add_argument("--repeat", type=config_type(GridConfig, "--repeat"),
                        help="--latency-table: copies of a sub-layer chained in its graph (default: as many as the "
                             "model has blocks)")
    parser.add_argument("--precision", choices=LATENCY_PRECISIONS,
                        help="--latency-table: part graph precision (default: fp16 on TensorRT, fp32 on ort)")
    parser.add_argument("--threads", type=config_type(DeviceTableConfig, "--threads"),
                        help="--latency-table with --backend ort: intra-op threads on the device (default: ORT's)")
    parser.set_defaults(run=run)


def run(args) -> int:
    import sys
    from pathlib import Path

    from edge.deploy import DeployConfig, RunnerOptions, SshOptions, deploy, parse_host, read_hosts

    hosts = [parse_host(h, args.port) for h in args.host]
    if args.hosts:
        hosts += read_hosts(args.hosts, args.port)
    config = DeployConfig(
        ssh=SshOptions(identity=Path(args.identity) if args.identity else None,
                       known_hosts=Path(args.known_hosts) if args.known_hosts else None,
                       accept_new_host_key=args.accept_new_host_key, connect_timeout_s=args.connect_timeout),
        runner=RunnerOptions(backend=args.backend, builder=args.builder, power_mode=args.power_mode,
                             lock_clocks=args.lock_clocks, nvpmodel_conf=args.nvpmodel_conf),
        remote_dir=args.remote_dir, remote_python=args.remote_python, plugin_ratio=args.plugin_ratio)
    if args.check:
        return check_devices(hosts, config, args.json)
    if args.latency_table:
        return latency_tables(args, hosts, config)
    if args.bundle is None:
        from edge.errors import EdgeError

        raise EdgeError("no bundle given", expected="a bundle folder or .tar.gz, or --latency-table MODEL",
                        fix="pass the bundle written by `edge bundle --out`")
    result = deploy(args.bundle, hosts, config, out=results_folder(args),
                    progress=lambda message: print(message, file=sys.stderr, flush=True))
    result["report"] = report_devices(args.report, result["out"]) if args.report else None
    print_device_errors(result["devices"])
    lines = [f"{d['host']}: {d['status']}" + (f" ({d['error'].splitlines()[0]})" if d["error"] else "")
             for d in result["devices"]]
    lines.append(f"results in {result['out']}" + (f"; report {result['report']}" if result["report"] else ""))
    for label, rows in (result.get("plugin_ratio") or {}).items():
        lines += [f"{label}: {r['plugin_variant']}.{r['precision']} is {r['speedup']:.3f}x {r['variant']} "
                  f"({r['without_ms']:.3f} -> {r['with_ms']:.3f} ms median)" + _gate_note(r) for r in rows]
    if result["failed"]:
        lines.append(f"{len(result['failed'])} of {len(result['devices'])} devices failed: "
                     + ", ".join(result["failed"]))
    emit(result, args.json, "\n".join(lines))
    return deploy_exit_status(result["devices"])


def _gate_note(row: dict) -> str:
    """What the accuracy gate said against a plugin ratio's engines, when one of them failed it."""
    wrong = [row[side] for side, key in (("variant", "without"), ("plugin_variant", "with"))
             if (row.get("accuracy") or {}).get(key) == "wrong"]
    return f"; the accuracy gate marks {' and '.join(wrong)} wrong: not a usable speed-up" if wrong else ""


def check_devices(hosts, config, as_json: bool) -> int:
    """``--check``: each host's checks as a table (or JSON); 1 when one failed, 0 when all passed."""
    from edge.deploy.preflight import preflight
    from edge.errors import EdgeError
    from jetson.check import table

    if not hosts:
        raise EdgeError("no device given", fix="pass --host user@address (repeatable) or --hosts FILE")
    result = preflight(hosts, config.ssh, config.remote_python, config.runner)
    human = "\n\n".join(f"{h['host']}: {'ready' if h['ok'] else 'NOT READY'}\n" + table(h["checks"])
                         for h in result["hosts"])
    emit(result, as_json, human)
    return 0 if result["ok"] else 1


def print_device_errors(devices: list[dict]) -> None:
    """Each failed device's whole error on stderr: the device's own words (its refusal, the value asked and
    the alternatives, the fix), not only a line of the summary or a file in its folder."""
    import sys

    for device in devices:
        if device["error"]:
            print(f"edge deploy: {device['host']} failed ({device['error_kind']}):\n  "
                  + device["error"].replace("\n", "\n  "), file=sys.stderr)


def deploy_exit_status(devices: list[dict]) -> int:
    """0 every device done; 2 a device sent results that were refused (a link, a name outside results/,
    malformed JSON: nothing written); 1 some other device failure."""
    from edge.deploy.untrusted import REFUSED

    if any(d["error_kind"] == REFUSED for d in devices):
        return 2
    return 1 if any(d["status"] != "ok" for d in devices) else 0


def results_folder(args):
    """--out; with --report, by default the run's device folder (the run is checked before any device is reached)."""
    if not args.report:
        return args.out
    from edge.pipeline import device_results_folder

    run_devices = device_results_folder(args.report)
    return args.out or run_devices


def report_devices(run_dir: str, results: str) -> str:
    """The results fetched into ``results`` (every device there) handed to the pipeline's report writer:
    the run's report gains its device section; the report's path."""
    from edge.deploy import fetched_devices
    from edge.pipeline import add_device_results

    return str(add_device_results(run_dir, fetched_devices(results)))


def latency_tables(args, hosts, config) -> int:
    import sys
    from pathlib import Path

    from edge.compress.load import load_model
    from edge.errors import EdgeError
    from edge.latency.device_table import DeviceTableConfig, deploy_table
    from edge.latency.grid import GridConfig

    if args.bundle is not None or args.report:
        raise EdgeError(f"--latency-table with {'the bundle ' + args.bundle if args.bundle else '--report'}",
                        expected="--latency-table alone: it makes and deploys its own bundle of part graphs",
                        fix="deploy the bundle and time the table in two commands")
    if not hosts:
        raise EdgeError("no device given", fix="pass --host user@address (repeatable) or --hosts FILE")
    model = load_model(args.latency_table)
    table_config = DeviceTableConfig(grid=GridConfig(grid=args.grid, batch=args.batch, repeat=args.repeat),
                                     precision=args.precision,
                                     threads=args.threads)
    out = Path(args.out) if args.out else Path(f"latency-{Path(args.latency_table).name}")
    result = deploy_table(model, hosts, config, table_config, out=out, source=args.latency_table,
                          progress=lambda message: print(message, file=sys.stderr, flush=True))
    lines = [f"{label}: {path}" for label, path in result["tables"].items()]
    lines += [f"{label}: failed ({error.splitlines()[0]})" for label, error in result["failed"].items()]
    emit(result, args.json, "\n".join(lines))
    return 1 if result["failed"] else 0
