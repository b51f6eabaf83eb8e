"""What a deployment needs to know about a model repository, read from its configs.

Each `config.pbtxt` is parsed with Triton's own ModelConfig protobuf, so a repository
that Triton would refuse is refused here too, before any manifest is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from latte.deploy.errors import DeployError

# Python packages each latte runtime imports inside the server image.
RUNTIME_PACKAGES: Dict[str, Tuple[str, ...]] = {
    "torchscript": ("torch",),
    "torch_export": ("torch",),
    "onnx": ("onnxruntime",),
    "tensorrt": ("tensorrt",),
    # No runtime parameter and no telling file name: the backend detects it at load time.
    "unknown": ("onnxruntime", "torch"),
}
_EXTENSION_RUNTIMES = {".pt": "torchscript", ".ts": "torchscript", ".pt2": "torch_export",
                       ".onnx": "onnx", ".plan": "tensorrt", ".engine": "tensorrt"}


@dataclass(frozen=True)
class ModelFacts:
    name: str
    backend: str                  # "latte", "python", "onnxruntime", ... or the platform
    gpu_instances: int            # instances in KIND_GPU groups
    gpus_needed: int              # GPUs one pod must expose so every KIND_GPU group can be placed
    cpu_threads: int              # instances x intra_op_threads of latte models (0 for others)
    max_queue_delay_us: int       # the dynamic batcher's longest wait, 0 without one
    runtime: str = ""             # latte runtime ("torchscript", "onnx", ..., "unknown"), "" for other backends
    response_cache: bool = False  # the config enables Triton's response cache
    slo_ms: float = 0.0           # its P95 bound (parameters slo_ms, written by latte generate); 0: none set


@dataclass(frozen=True)
class RepositoryFacts:
    path: Path
    models: Tuple[ModelFacts, ...]

    @property
    def gpus_needed(self) -> int:
        return max((m.gpus_needed for m in self.models), default=0)

    @property
    def gpu_models(self) -> List[str]:
        return [m.name for m in self.models if m.gpu_instances]

    @property
    def cpu_threads(self) -> int:
        return sum(m.cpu_threads for m in self.models)

    @property
    def max_queue_delay_us(self) -> int:
        return max((m.max_queue_delay_us for m in self.models), default=0)

    @property
    def cache_models(self) -> List[str]:
        return [m.name for m in self.models if m.response_cache]

    @property
    def runtimes(self) -> List[str]:
        return sorted({m.runtime for m in self.models if m.runtime})

    @property
    def python_packages(self) -> List[str]:
        return sorted({pkg for r in self.runtimes for pkg in RUNTIME_PACKAGES.get(r, ())})


def _parameter(config, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def _model_facts(config) -> ModelFacts:
    from tritonclient.grpc import model_config_pb2

    kind_gpu = model_config_pb2.ModelInstanceGroup.Kind.KIND_GPU
    gpu_instances = 0
    gpus_needed = 0
    instances = 0
    for group in config.instance_group:
        count = group.count or 1
        instances += count
        if group.kind == kind_gpu:
            gpu_instances += count
            # Listed device ids must all exist in the pod; without a list Triton puts the
            # instances on every visible GPU, so one is enough.
            gpus_needed = max(gpus_needed, (max(group.gpus) + 1) if group.gpus else 1)
    instances = instances or 1
    delay = config.dynamic_batching.max_queue_delay_microseconds if config.HasField("dynamic_batching") else 0
    backend = config.backend or config.platform
    runtime = ""
    threads = 0
    if backend == "latte":
        runtime = _parameter(config, "runtime") or _EXTENSION_RUNTIMES.get(
            Path(_parameter(config, "model_file")).suffix, "unknown")
        try:
            intra = int(_parameter(config, "intra_op_threads") or 1)
        except ValueError:
            raise DeployError(f"model {config.name!r}: parameters[\"intra_op_threads\"] must be an integer, "
                              f"got {_parameter(config, 'intra_op_threads')!r}") from None
        threads = instances * max(intra, 1)
    return ModelFacts(name=config.name, backend=backend, gpu_instances=gpu_instances, gpus_needed=gpus_needed,
                      cpu_threads=threads, max_queue_delay_us=int(delay), runtime=runtime,
                      response_cache=config.response_cache.enable, slo_ms=_slo_ms(config))


def _slo_ms(config) -> float:
    text = _parameter(config, "slo_ms")
    try:
        value = float(text) if text else 0.0
    except ValueError:
        value = -1.0
    if (text and value <= 0) or value != value:
        raise DeployError(f"model {config.name!r}: parameters[\"slo_ms\"] must be a number of milliseconds > 0, "
                          f"got {text!r}")
    return value


def read_repository(repo: Path) -> RepositoryFacts:
    """Parse every REPO/<model>/config.pbtxt; raise DeployError when REPO serves nothing."""
    from latte.generator.validate import InvalidConfig, parse_config_file

    repo = Path(repo)
    if not repo.is_dir():
        raise DeployError(f"model repository {repo} is not a folder")
    folders = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    models = []
    for folder in folders:
        config_path = folder / "config.pbtxt"
        if not config_path.is_file():
            raise DeployError(f"{folder} has no config.pbtxt; every model folder of a latte repository needs one "
                              "(remove the folder or generate its config with `latte generate`)")
        try:
            models.append(_model_facts(parse_config_file(config_path)))
        except InvalidConfig as exc:
            raise DeployError(f"invalid model config: {exc}") from None
    if not models:
        raise DeployError(f"model repository {repo} holds no models (expected REPO/<model>/config.pbtxt); "
                          "build one with `latte examples DIR` or `latte generate`")
    return RepositoryFacts(path=repo.resolve(), models=tuple(models))
