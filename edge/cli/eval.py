"""``edge eval``: accuracy of a model on the full test split of a data set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.cli.common import (
    add_command,
    add_data_option,
    add_field,
    add_model_options,
    add_seed_option,
    add_threads_option,
    emit,
)
from edge.cli.options import Device

if TYPE_CHECKING:
    from edge.data import InputSpec
    from edge.precision.calibration import InputOptions

EXAMPLES = """  edge eval fmnist-deit-tiny --data fmnist --json
  edge eval fmnist-deit-tiny --data fmnist-mini
  edge eval runs/ref-linear-9-10 --data fmnist --probe     # the papers' linear-probe protocol
  edge eval runs/ref.onnx --data fmnist --json              # an exported graph, with ONNX Runtime
  edge eval their.onnx --data fmnist --input-size 1x28x28 --mean 0.286 --std 0.353   # another exporter's graph
  edge eval timm:deit_small_patch16_224 --weights deit_small.safetensors --data ~/imagenette"""


def register(subparsers) -> None:
    from edge.check.accuracy import EvaluateConfig
    from edge.cli.quantize import add_input_options
    from edge.probe import ProbeConfig

    parser = add_command(subparsers, "eval", "measure top-1 accuracy on a data set's test split",
                         "Uses the model's own preprocessing (timm data config: size, mean, std); an .onnx graph's\n"
                         "is what it records (edge export), or --input-size, --mean and --std for a graph from\n"
                         "another exporter (torch.onnx, Hugging Face), which records none.", EXAMPLES)
    add_model_options(parser)
    add_input_options(parser)
    add_data_option(parser, None, "your images (a folder with train/ and val/ or test/), fmnist or fmnist-mini; "
                    "default: a bundled model's own data set (the full Fashion-MNIST); every other model needs it")
    parser.add_argument("--split", default="test", choices=["test", "train"], help="which split to measure on")
    add_field(parser, "--batch-size", EvaluateConfig, help="images per forward pass")
    parser.add_argument("--device", type=Device(), default="cpu", help="cpu, cuda[:N] or auto")
    add_threads_option(parser)
    parser.add_argument("--probe", action="store_true",
                        help="linear-probe protocol: frozen backbone, linear classifier (Adam 1e-3, batch 256, "
                             "5 epochs) trained on the train split, accuracy on the test split")
    add_seed_option(parser, ProbeConfig, help="seed of the probe")
    parser.set_defaults(run=run)


def run(args) -> int:
    from edge.check.accuracy import evaluate
    from edge.cli.quantize import input_options
    from edge.compress.load import load_model
    from edge.data import InputSpec, load_dataset
    from edge.models import data_config, data_for
    from edge.runtime import hardware, resolve_device, set_threads

    options = input_options(args)
    if options.given() and not args.model.endswith(".onnx"):
        from edge.errors import EdgeError

        raise EdgeError(f"--input-size, --mean and --std for {args.model}", expected="an .onnx graph (the "
                        "preprocessing of a graph from another exporter)", found="a model, whose preprocessing is "
                        "its own timm data config", fix="leave --input-size, --mean and --std out")
    set_threads(args.threads)
    device = resolve_device(args.device)
    args.data = data_for(args.data, args.model)
    dataset = load_dataset(args.data, args.split)
    if args.model.endswith(".onnx"):
        from edge.check.compare import concurrent_calls
        from edge.check.onnx_classifier import OnnxClassifier
        from edge.onnx_metadata import precision_of

        calls, threads = concurrent_calls(args.threads) if args.threads else (1, None)
        graph = OnnxClassifier(args.model, threads=threads, calls=calls)
        result = {"model": args.model, **evaluate(graph, dataset, onnx_input_spec(args.model, options),
                                                  batch_size=args.batch_size),
                  "precision": precision_of(graph.metadata), "backend": "onnxruntime",
                  "hardware": hardware()}
        emit(result, args.json, f"{args.model} on {result['data']} (ONNX Runtime): accuracy {result['accuracy']:.4f} "
                                f"({result['correct']}/{result['samples']})")
        return 0
    model = load_model(args.model, weights=args.weights, img_size=args.img_size)
    spec = InputSpec.from_data_config(data_config(model))
    if args.probe:
        from edge.probe import ProbeConfig, linear_probe

        train_set = load_dataset(args.data, "train")
        result = {"model": args.model, "data": dataset.name, "protocol": "linear-probe",
                  **linear_probe(model, train_set, dataset, spec, ProbeConfig(seed=args.seed)),
                  "precision": "float32", "backend": "torch", "hardware": hardware(device)}
        emit(result, args.json, f"{args.model} on {dataset.name} (linear probe): accuracy {result['accuracy']:.4f} "
                                f"({result['correct']}/{result['samples']})")
        return 0
    result = {"model": args.model, **evaluate(model, dataset, spec, batch_size=args.batch_size, device=device),
              "precision": "float32", "backend": "torch", "hardware": hardware(device)}
    emit(result, args.json, f"{args.model} on {result['data']}: accuracy {result['accuracy']:.4f} "
                            f"({result['correct']}/{result['samples']}) loss {result['loss']:.4f}")
    return 0


def onnx_input_spec(path: str, options: InputOptions) -> InputSpec:
    """The preprocessing of the graph at ``path``: ``options`` (--input-size, --mean, --std) first, then what the
    graph records (edge export), then (the size only) its static input shape; an EdgeError names the options
    still missing. Shared by ``edge eval`` and ``edge verify``."""
    import onnx

    from edge.precision.calibration import input_spec_of

    return input_spec_of(onnx.load(path, load_external_data=False), path, options)
