"""The edge models plan_peers compares: ``--edge`` artifacts checked, ``--plans`` compressed (cached in ``--work``)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from _artifacts import cached_artifact
from _peers_names import short_hash, slug

from edge.compress import CompressConfig, is_artifact
from edge.compress.artifact import MANIFEST, read_manifest
from edge.errors import EdgeError

MODEL = "fmnist-deit-tiny"


def edge_artifact(path: str | Path, model: str) -> dict:
    """The manifest of the edge artifact at ``path``, or an EdgeError naming the path and what is wrong."""
    path = Path(path)
    expected = f"a folder written by `edge compress` or `edge plan` (holding {MANIFEST}) from {model}"
    if not path.exists():
        raise EdgeError(f"--edge {path} does not exist", expected=expected, fix="check the path")
    if not path.is_dir() or not is_artifact(path):
        raise EdgeError(f"--edge {path} is not an edge artifact", expected=expected,
                        found="a file" if path.is_file() else f"a folder without {MANIFEST}",
                        fix="pass the --out folder of `edge compress` / `edge plan`")
    manifest = read_manifest(path)
    source = (manifest.get("source") or {}).get("model")
    if source != model:
        raise EdgeError(f"--edge {path} was compressed from {source}, not from {model}", expected=expected,
                        fix=f"pass artifacts of {model}, or --model {source}")
    if manifest.get("finetune"):
        raise EdgeError(f"--edge {path} is already fine-tuned", expected="an artifact before any distillation: "
                        "every model gets the same distillation budget here",
                        fix="pass the artifact `edge compress` / `edge plan` wrote, before `edge finetune`")
    return manifest


def edge_models(args) -> list[dict]:
    """``{"key", "label", "path", "plan"}`` per edge model: the ``--edge`` artifacts, then the ``--plans``."""
    found = []
    for path in args.edge:
        manifest = edge_artifact(path, args.model)
        found.append({"path": str(Path(path)), "plan": manifest.get("plan")})
    for plan in args.plans:
        folder = Path(args.work) / "edge" / slug(plan)
        config = CompressConfig(plan=plan, data=args.data, samples=args.samples, seed=args.seed)
        manifest = cached_artifact(args.model, config, folder)
        # named by what made it, not where it lies: another machine (--stage distil) finds the same key
        found.append({"path": str(folder), "plan": manifest.get("plan"),
                      "made_by": json.dumps({"model": args.model, **asdict(config)}, sort_keys=True)})
    if not found:
        raise EdgeError("no edge model to compare", expected="--edge ARTIFACT ... or --plans PLAN ...",
                        fix="pass the folders `edge plan` wrote with --edge")
    for item in found:
        origin = item.pop("made_by", None) or str(Path(item["path"]).resolve())
        item["key"] = f"edge-{slug(item['plan'] or 'none')}-{short_hash(origin)}"
        item["label"] = f"edge `{item['plan']}`"
    return found
