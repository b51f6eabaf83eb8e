"""Checking configs with Triton's own `ModelConfig` protobuf."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format


class InvalidConfig(ValueError):
    """A config.pbtxt that Triton would refuse; the message names the file and line."""


def model_config_class():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.ModelConfig


def parse_config(text: str, source: str = "config.pbtxt"):
    """Parse config text into Triton's ModelConfig message, or raise InvalidConfig."""
    message = model_config_class()()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise InvalidConfig(f"{source}: {exc}") from None
    if not message.name:
        raise InvalidConfig(f"{source}: the config has no name")
    return message


def parse_config_file(path: Path):
    path = Path(path)
    config = parse_config(path.read_text(), str(path))
    if config.name != path.parent.name:
        raise InvalidConfig(f"{path}: name {config.name!r} differs from its folder {path.parent.name!r}")
    return config


class RepositoryError(ValueError):
    """A model repository with problems; `problems` holds one located line each."""

    def __init__(self, problems) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _data_type_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


def interface_of(config):
    """The tensors and batching of a parsed ModelConfig, as the ensemble check sees them."""
    from latte.generator.dag import Interface, TensorInfo

    return Interface(
        name=config.name, max_batch_size=config.max_batch_size,
        inputs={t.name: TensorInfo(_data_type_name(t.data_type), tuple(t.dims)) for t in config.input},
        outputs={t.name: TensorInfo(_data_type_name(t.data_type), tuple(t.dims)) for t in config.output},
        optional_inputs=tuple(t.name for t in config.input if t.optional),
    )


def ensemble_wiring(config):
    from latte.generator.dag import EnsembleWiring, StepWiring, TensorInfo

    steps = [StepWiring(s.model_name, dict(s.input_map), dict(s.output_map))
             for s in config.ensemble_scheduling.step]
    return EnsembleWiring(
        name=config.name, max_batch_size=config.max_batch_size,
        inputs={t.name: TensorInfo(_data_type_name(t.data_type), tuple(t.dims)) for t in config.input},
        outputs={t.name: TensorInfo(_data_type_name(t.data_type), tuple(t.dims)) for t in config.output},
        steps=steps,
    )


def config_key_path(path) -> str:
    """An ensemble key path as the config.pbtxt field it came from."""
    if path and path[0] == "steps":
        text = f"ensemble_scheduling.step[{path[1]}]"
        if len(path) > 2:
            field = {"inputs": "input_map", "outputs": "output_map", "model": "model_name"}[path[2]]
            text += f".{field}" + (f"[{path[3]!r}]" if len(path) > 3 else "")
        return text
    if path and path[0] in ("inputs", "outputs"):
        return f"{path[0][:-1]}[{path[1]!r}]" if len(path) > 1 else path[0][:-1]
    return ".".join(str(p) for p in path)


def _policy_problems(model_dir: Path, config, present: list) -> list:
    """Versions the version_policy asks for that have no folder: Triton would serve fewer, or none."""
    policy = config.version_policy
    kind = policy.WhichOneof("policy_choice")
    found = ", ".join(map(str, present))
    if kind == "specific":
        return [f"{model_dir}/config.pbtxt: version_policy lists version {v}, but {model_dir}/{v}/ does not "
                f"exist (version folders: {found})" for v in policy.specific.versions if v not in present]
    if kind == "latest" and policy.latest.num_versions > len(present):
        return [f"{model_dir}/config.pbtxt: version_policy serves the latest {policy.latest.num_versions} "
                f"versions, but only {len(present)} version folder(s) exist ({found})"]
    return []


def _version_problems(model_dir: Path, config) -> list:
    versions = [d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if config.platform == "ensemble":
        return []
    if not versions:
        return [f"{model_dir}: no version folder (e.g. {model_dir}/1/) holding the model"]
    problems = _policy_problems(model_dir, config, sorted(int(v.name) for v in versions))
    params = {k: v.string_value for k, v in config.parameters.items()}
    for version in versions:
        if config.backend == "python" and not (version / "model.py").exists():
            problems.append(f"{version}: a python-backend model needs model.py here")
        if config.backend == "latte" and params.get("model_file") and not (version / params["model_file"]).exists():
            problems.append(f"{version}: parameters[\"model_file\"] names {params['model_file']!r}, "
                            "which is not in this folder")
    for warmup in config.model_warmup:
        for name, data in warmup.inputs.items():
            if data.input_data_file and not (model_dir / "warmup" / data.input_data_file).exists():
                problems.append(f"{model_dir}/config.pbtxt: model_warmup {warmup.name!r} input {name!r} reads "
                                f"warmup/{data.input_data_file}, which does not exist")
    return problems


def validate_repository(repo: Path):
    """Parse every config.pbtxt in REPO and check each ensemble's DAG; returns the configs.

    Raises RepositoryError listing every problem found, each naming its file.
    """
    from latte.generator.dag import check_ensemble

    repo = Path(repo)
    if not repo.is_dir():
        raise RepositoryError([f"{repo}: the model repository does not exist"])
    configs, problems = {}, []
    for model_dir in sorted(d for d in repo.iterdir() if d.is_dir()):
        path = model_dir / "config.pbtxt"
        if not path.exists():
            problems.append(f"{model_dir}: no config.pbtxt")
            continue
        try:
            configs[model_dir.name] = parse_config_file(path)
        except InvalidConfig as exc:
            problems.append(str(exc))
            continue
        problems.extend(_version_problems(model_dir, configs[model_dir.name]))
    interfaces = {name: interface_of(c) for name, c in configs.items()}
    for name, config in configs.items():
        if config.platform != "ensemble":
            continue
        source = repo / name / "config.pbtxt"
        problems.extend(check_ensemble(ensemble_wiring(config), interfaces,
                                       lambda p, s=source: f"{s}: {config_key_path(p)}"))
    if problems:
        raise RepositoryError(problems)
    if not configs:
        raise RepositoryError([f"{repo}: no model folders with a config.pbtxt"])
    return configs
