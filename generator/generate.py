"""`latte generate`: a pipeline spec in, a complete, validated model repository out."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional

import numpy as np

from latte.backend.config import GRAPH_FILE, ThreadBudget
from latte.backend.dtypes import TRITON_TO_NUMPY
from latte.backend.samples import encode_sample, sample_values
from latte.triton.perf import read_input_data
from latte.generator.calibrate import ServingCost, machine_serving_cost
from latte.generator.dag import EnsembleError, EnsembleWiring, Interface, StepWiring, TensorInfo, check_ensemble
from latte.generator.fuse import Fusion, fuse_ensemble, step_source, write_fused_model
from latte.generator.derive import DEFAULT_BACKEND_OVERHEAD_MS, Derivation, derive, health_rules, slowest_execute_ms
from latte.generator.config_summary import derivation_report
from latte.generator.operating_point import OperatingPoint, plan_operating_points, write_operating_points
from latte.generator.profile_data import Profile, latency_ceiling_ms
from latte.generator.model_folder import render_model_config, write_ensemble, write_model
from latte.generator.spec import EnsembleEntry, ModelEntry, PipelineSpec, Tensor, load_spec
from latte.generator.stream_cost import machine_response_cost
from latte.generator.stream_plan import load_or_profile_stream, plan_stream_model
from latte.generator.validate import InvalidConfig, batcher_stall, parse_config, validate_repository

if TYPE_CHECKING:
    from latte.generator.derive_streams import StreamDerivation
    from latte.generator.stream_profile import StreamProfile

# Requests of an ensemble's samples a fused model keeps: it checks its steps with them at load,
# and generate profiles it on them.
FUSED_SAMPLES = 16
# Variable dimensions of warm-up samples take this size (or the longest profiled length if shorter).
WARMUP_LENGTH = 16


@dataclass
class ModelPlan:
    """One model folder to write: its config context and the files that go with it."""
    name: str
    backend: str
    context: Dict
    files: Dict[str, Path]                       # name inside the version folder -> source
    warmup_files: Dict[str, bytes] = field(default_factory=dict)
    derivation: Optional[Derivation] = None
    profile: Optional[Profile] = None
    stream_derivation: Optional["StreamDerivation"] = None   # a streaming model's settings
    stream_profile: Optional["StreamProfile"] = None
    # version number -> files of that version folder; empty means `files` in folder 1.
    version_files: Dict[int, Dict[str, Path]] = field(default_factory=dict)


def _tensors_from_profile(entries: List[dict], batched: bool) -> List[Tensor]:
    out = []
    for t in entries:
        dims = [int(d) for d in t["dims"]]
        ragged = bool(t.get("ragged", batched and -1 in dims))
        out.append(Tensor(t["name"], t["data_type"], dims, ragged=ragged and batched))
    return out


def _merge(base: Dict, extra: Dict) -> Dict:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def plan_latte_model(spec: PipelineSpec, model: ModelEntry, profile: Profile) -> ModelPlan:
    doc = spec.source
    if model.backend_overhead_ms is not None:
        serving = ServingCost.flat(model.backend_overhead_ms, "the spec's backend_overhead_ms")
    else:
        serving = profile.serving or ServingCost.flat(DEFAULT_BACKEND_OVERHEAD_MS,
                                                      "assumed: the profile was taken without calibration")
    d = derive(profile, model.slo_ms, model.arrival_rate, spec.cores, spec.gpus, model.priority_levels, serving,
               model.priority_queue)
    over = model.overrides
    max_batch = int(over.get("max_batch_size", d.max_batch_size))
    dynamic = _merge(d.dynamic_batching, over.get("dynamic_batching") or {})
    if "preferred_batch_size" in dynamic:
        dynamic["preferred_batch_size"] = [b for b in dynamic["preferred_batch_size"] if b <= max_batch]
    count = int(over.get("instance_count", d.instance_count))
    kind = over.get("instance_kind", d.instance_kind)
    parameters = {**d.parameters, **{k: str(v) for k, v in (over.get("parameters") or {}).items()}}
    intra = int(parameters.get("intra_op_threads", "1"))
    if kind == "KIND_CPU" and ThreadBudget(count * intra, spec.cores, intra).refused:
        raise doc.error(model.path + ("overrides",), f"{count} instance(s) x intra_op_threads {intra} exceed the "
                        f"{spec.cores} core(s) in resources.cores; multi-threaded instances must fit the cores, "
                        f"so lower one of them")
    batched = max_batch > 0
    inputs = model.inputs or _tensors_from_profile(profile.inputs, batched)
    outputs = model.outputs or _tensors_from_profile(profile.outputs, False)
    for t in outputs:
        t.ragged = False
    lengths = [b for b in profile.buckets() if b is not None]
    if any(t.ragged for t in inputs) and lengths:
        parameters.setdefault("max_sequence_length", str(max(lengths)))
        parameters.setdefault("pad_value", "0")
    model_file = f"model{model.file.suffix}"
    parameters = {"model_file": model_file, "runtime": model.runtime, **parameters}
    # The bound the deployment's alerts hold the model to (latte deploy k8s, monitoring.py).
    parameters.setdefault("slo_ms", f"{model.slo_ms:g}")
    # What latte serve supervises the model by; the spec's overrides win.
    for key, value in health_rules(model.slo_ms, slowest_execute_ms(profile, max_batch),
                                   model.health_rss_growth_mib_per_min).items():
        parameters.setdefault(key, value)

    rng = np.random.default_rng(0)
    warmup_inputs, warmup_files = [], {}
    if all(t.data_type in TRITON_TO_NUMPY for t in inputs):
        length = min(WARMUP_LENGTH, max(lengths)) if lengths else WARMUP_LENGTH
        for t in inputs:
            dims = [length if dim == -1 else dim for dim in t.dims]
            warmup_files[t.name] = sample_values(t.data_type, dims, rng).tobytes()
            warmup_inputs.append({"name": t.name, "data_type": t.data_type, "dims": dims, "file": t.name})
    context = {
        "name": model.name, "backend": "latte", "max_batch_size": max_batch,
        "inputs": [t.context() for t in inputs], "outputs": [t.context() for t in outputs],
        "dynamic_batching": dynamic if batched else None,
        "instance_groups": [{"count": count, "kind": kind}],
        "parameters": parameters,
        "warmup": [{"name": "sample", "batch_size": 1, "inputs": warmup_inputs}] if warmup_inputs else [],
    }
    return ModelPlan(model.name, "latte", context, {model_file: model.file}, warmup_files, d, profile)


def plan_python_model(model: ModelEntry) -> ModelPlan:
    context = {
        "name": model.name, "backend": "python", "max_batch_size": model.max_batch_size,
        "inputs": [t.context() for t in model.inputs], "outputs": [t.context() for t in model.outputs],
        "dynamic_batching": None,
        "instance_groups": [{"count": model.instance_count, "kind": "KIND_CPU"}],
        "parameters": {},
    }
    return ModelPlan(model.name, "python", context, {"model.py": model.file})


def add_versions_and_cache(spec: PipelineSpec, plan: ModelPlan, model: ModelEntry) -> ModelPlan:
    """The spec's versions (one folder each, same file name), version_policy and response_cache."""
    if model.response_cache and "session_input" in plan.context["parameters"]:
        # Triton's cache key is the inputs alone: a session's request would get another session's answer.
        raise spec.source.error(model.path + ("response_cache",), "a model with sessions (session_input) answers "
                                "the same inputs differently per session; Triton's cache would not, so turn one off")
    if model.versions:
        (name,) = plan.files
        plan.version_files = {number: {name: source} for number, source in sorted(model.versions.items())}
    plan.context["version_policy"] = model.version_policy
    plan.context["response_cache"] = model.response_cache
    return plan


def _interface(plan: ModelPlan) -> Interface:
    ctx = plan.context
    return Interface(
        name=plan.name, max_batch_size=ctx["max_batch_size"],
        inputs={t["name"]: TensorInfo(t["data_type"], tuple(t["dims"])) for t in ctx["inputs"]},
        outputs={t["name"]: TensorInfo(t["data_type"], tuple(t["dims"])) for t in ctx["outputs"]},
        optional_inputs=tuple(t["name"] for t in ctx["inputs"] if t.get("optional")),
    )


def _spec_where(spec: PipelineSpec, ensemble: EnsembleEntry) -> Callable:
    """Ensemble key paths as spec file:line: key."""

    def where(path):
        if path and path[0] in ("inputs", "outputs") and len(path) > 1:
            tensors = ensemble.inputs if path[0] == "inputs" else ensemble.outputs
            index = next((i for i, t in enumerate(tensors) if t.name == path[1]), None)
            path = (path[0], index, "name") if index is not None else path[:1]
        return spec.source.where(ensemble.path + tuple(path))
    return where


def ensemble_context(ensemble: EnsembleEntry, interfaces: Dict[str, Interface]) -> Dict:
    steps_batch = [interfaces[s.model].max_batch_size for s in ensemble.steps if s.model in interfaces]
    max_batch = ensemble.max_batch_size if ensemble.max_batch_size is not None else min(steps_batch, default=0)
    return {
        "name": ensemble.name, "max_batch_size": max_batch,
        "inputs": [t.context() for t in ensemble.inputs], "outputs": [t.context() for t in ensemble.outputs],
        "steps": [{"model": s.model, "inputs": s.inputs, "outputs": s.outputs} for s in ensemble.steps],
    }


def check_spec_ensembles(spec: PipelineSpec, interfaces: Dict[str, Interface]) -> List[Dict]:
    """Check every ensemble of the spec; raise EnsembleError naming spec lines, else return contexts."""
    contexts, problems = [], []
    for ensemble in spec.ensembles:
        context = ensemble_context(ensemble, interfaces)
        wiring = EnsembleWiring(
            name=ensemble.name, max_batch_size=context["max_batch_size"],
            inputs={t.name: TensorInfo(t.data_type, tuple(t.dims)) for t in ensemble.inputs},
            outputs={t.name: TensorInfo(t.data_type, tuple(t.dims)) for t in ensemble.outputs},
            steps=list(ensemble.steps))
        problems.extend(check_ensemble(wiring, interfaces, _spec_where(spec, ensemble)))
        contexts.append(context)
    if problems:
        raise EnsembleError(problems)
    return contexts


def _refuse_stall(plan: ModelPlan, templates: Optional[Path]) -> None:
    """Never write a config that Triton 2.51 serves with ~500 ms stalls (docs/backend.md, Priorities)."""
    text = render_model_config(plan.context, templates)
    stall = batcher_stall(parse_config(text, f"{plan.name}/config.pbtxt"))
    if stall:
        raise InvalidConfig(f"{plan.name}/config.pbtxt not written: {stall}")


def _runs_on_cuda(runtime: str) -> bool:
    """Whether this machine has a CUDA device and `runtime` computes on it (onnxruntime only
    with its CUDA provider installed)."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    if runtime == "onnx":
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    return True


def profile_device(gpus: int, runtime: str, name: str, log: Callable[[str], None] = lambda line: None) -> str:
    """Where a model of a spec is profiled, and so which instances it gets (derive): the first
    GPU where the spec gives GPUs and the model computes on this machine's; else the CPU, said
    in the log where the spec asked for GPUs."""
    if gpus <= 0:
        return "cpu"
    if _runs_on_cuda(runtime):
        return "cuda:0"
    log(f"{name}: profiled on the CPU although the spec gives {gpus} GPU(s): no CUDA device here that its "
        f"{runtime} runtime computes on, so its instances are KIND_CPU")
    return "cpu"


def load_or_profile(model: ModelEntry, profiles_dir: Path, log: Callable[[str], None],
                    serving_cost: Callable[[], Optional[ServingCost]] = lambda: None, device: str = "cpu") -> Profile:
    if model.profile is not None:
        return Profile.load(model.profile)
    from latte.generator.profile import ProfileOptions, profile_model

    target = profiles_dir / f"{model.name}.json"
    if target.exists() and target.stat().st_mtime >= model.file.stat().st_mtime:
        kept = Profile.load(target)
        if kept.device != device:
            log(f"{model.name}: profile {target} was taken on {kept.device}; this spec's model runs on {device}")
        elif kept.covers_slo(model.slo_ms):
            log(f"{model.name}: reusing profile {target}")
            return kept
        else:
            log(f"{model.name}: profile {target} stops at {kept.max_latency_ms:g} ms a call, short of this SLO's "
                f"{latency_ceiling_ms(model.slo_ms):g} ms")
    log(f"{model.name}: profiling {model.file} (no profile in the spec)")
    inputs = [{"name": t.name, "data_type": t.data_type, "dims": t.dims} for t in model.inputs or []]
    profile = profile_model(model.file, ProfileOptions(runtime=model.runtime, intra_op_threads=model.intra_op_threads,
                                                       inputs=inputs or None, slo_ms=model.slo_ms, device=device))
    profile.serving = serving_cost()
    profiles_dir.mkdir(parents=True, exist_ok=True)
    profile.save(target)
    return profile


def fuse_spec_ensembles(spec: PipelineSpec, plans: List[ModelPlan], contexts: List[Dict],
                        templates: Optional[Path] = None) -> Dict[str, Fusion]:
    """Each ensemble of the spec with the steps latte can run fused (fuse.py), by name."""
    sources = {}
    by_name = {plan.name: plan for plan in plans}
    for plan in plans:
        message = parse_config(render_model_config(plan.context, templates), f"{plan.name}/config.pbtxt")
        entry = spec.model(plan.name)
        sources[plan.name] = step_source(message, plan.files, entry.function if entry else None)
    fusions = {}
    for context in contexts:
        wiring = EnsembleWiring(
            name=context["name"], max_batch_size=context["max_batch_size"],
            inputs={t["name"]: TensorInfo(t["data_type"], tuple(t["dims"])) for t in context["inputs"]},
            outputs={t["name"]: TensorInfo(t["data_type"], tuple(t["dims"])) for t in context["outputs"]},
            steps=[StepWiring(s["model"], dict(s["inputs"]), dict(s["outputs"])) for s in context["steps"]])
        entry = next(e for e in spec.ensembles if e.name == context["name"])
        samples = []
        if entry.samples is not None:
            samples = [{name: encode_sample(array) for name, array in request.items()}
                       for request in read_input_data(entry.samples)[:FUSED_SAMPLES]]
        fusions[context["name"]] = fuse_ensemble(wiring, {s.model: sources[s.model] for s in wiring.steps},
                                                 taken=list(by_name), samples=samples)
    return fusions


def write_ensembles(repo: Path, contexts: List[Dict], fusions: Mapping[str, Fusion],
                    templates: Optional[Path] = None) -> None:
    """Each ensemble as its fusion left it: a fused model under its name, or Triton's ensemble
    around the steps that did not fuse (the fused groups among them), or as it was."""
    for context in contexts:
        fusion = fusions.get(context["name"])
        for model in fusion.fused if fusion else []:
            write_fused_model(repo, model, templates)
        if fusion is not None and fusion.replaced:
            continue
        if fusion is not None and fusion.steps is not None:
            context = {**context, "steps": fusion.steps}
        write_ensemble(repo, context, templates)


@dataclass
class FusedPlan:
    """A fused model's own profile and the settings derived from it."""
    name: str
    derivation: Derivation
    profile_path: Path


def derive_fused(spec: PipelineSpec, repo: Path, fusions: Mapping[str, Fusion], plans: List[ModelPlan],
                 profiles_dir: Path, templates: Optional[Path] = None,
                 log: Callable[[str], None] = lambda line: None) -> List[FusedPlan]:
    """Profile each fused model as written (its whole graph, in this process) and derive its
    batching and instances from that profile against the tightest SLO of its latte steps (the
    ensemble's, or the spec ensemble's own slo_ms), at their arrival rate if the spec gives
    one (the spec ensemble's `profile:` spares the profiling); its config is rewritten with
    them. A fused model with no latte step keeps the settings its steps gave it."""
    from latte.generator.profile import ProfileOptions, profile_model

    by_name = {plan.name: plan for plan in plans}
    derived = []
    for fusion in fusions.values():
        entry = next(e for e in spec.ensembles if e.name == fusion.ensemble)
        for model in fusion.fused:
            latte = [by_name[step] for step in model.steps if by_name[step].derivation is not None]
            if not latte:
                continue
            slo = entry.slo_ms or min(plan.derivation.slo_ms for plan in latte)
            rates = [spec.model(plan.name).arrival_rate for plan in latte if spec.model(plan.name).arrival_rate]
            serving = next((plan.profile.serving for plan in latte if plan.profile and plan.profile.serving), None) \
                or ServingCost.flat(DEFAULT_BACKEND_OVERHEAD_MS, "assumed: its steps' profiles were taken without "
                                    "calibration")
            if model.name == fusion.ensemble and entry.profile is not None:
                profile, path = Profile.load(entry.profile), entry.profile
            else:
                log(f"{model.name}: profiling the fused model ({' -> '.join(model.steps)})")
                threads = int(model.context["parameters"].get("intra_op_threads", "1"))
                on_gpu = model.context["instance_groups"][0]["kind"] == "KIND_GPU"  # the device its steps chose
                profile = profile_model(repo / model.name / "1" / GRAPH_FILE,
                                        ProfileOptions(runtime="graph", intra_op_threads=threads, slo_ms=slo,
                                                       device="cuda:0" if on_gpu else "cpu"))
                profile.serving = serving
                profiles_dir.mkdir(parents=True, exist_ok=True)
                path = profile.save(profiles_dir / f"{model.name}.json")
            d = derive(profile, slo, min(rates) if rates else None, spec.cores, spec.gpus, 0, serving)
            context = model.context
            context["max_batch_size"] = d.max_batch_size
            context["dynamic_batching"] = dict(d.dynamic_batching)
            kind = context["instance_groups"][0]["kind"]  # the device its steps chose
            context["instance_groups"] = [{"count": d.instance_count, "kind": kind}]
            if "arena_bytes" in d.parameters:
                context["parameters"] = {**context["parameters"], "arena_bytes": d.parameters["arena_bytes"]}
            context["parameters"] = {**context["parameters"], "slo_ms": f"{slo:g}",
                                     **health_rules(slo, slowest_execute_ms(profile, d.max_batch_size))}
            write_fused_model(repo, model, templates)
            derived.append(FusedPlan(model.name, d, Path(path)))
    return derived


def generate(spec_path: Path, repo: Path, templates: Optional[Path] = None, profiles_dir: Optional[Path] = None,
             log: Callable[[str], None] = lambda line: None, install=None, recalibrate: bool = False,
             fuse: bool = True) -> List[ModelPlan]:
    """Write a model repository for the spec at spec_path into repo and validate it.

    A model profiled here gets this machine's serving cost: calibrated on a tritonserver
    (install, default: found as `latte tritonserver` finds it) once per machine and kept
    (calibrate.machine_serving_cost), or measured again with `recalibrate`. With `fuse`, each
    ensemble's steps that latte can run become one latte model (fuse.py); the summary of what
    fused, and why any step did not, goes to `log`."""
    spec = load_spec(spec_path)
    repo = Path(repo)
    profiles_dir = Path(profiles_dir) if profiles_dir else spec.directory / "profiles"
    # Measured (or read from the machine's cache) only when a model is profiled here, and once.
    serving_cost = functools.cache(lambda: machine_serving_cost(install, log, refresh=recalibrate))
    response_cost = functools.cache(lambda: machine_response_cost(install, log, refresh=recalibrate))

    plans = []
    for model in spec.models:
        if model.backend == "python":
            plans.append(plan_python_model(model))
        elif model.stream is not None:
            plans.append(plan_stream_model(spec, model, load_or_profile_stream(model, profiles_dir, log,
                                                                               response_cost)))
        else:
            profile = load_or_profile(model, profiles_dir, log, serving_cost,
                                      profile_device(spec.gpus, model.runtime, model.name, log))
            plans.append(plan_latte_model(spec, model, profile))
        add_versions_and_cache(spec, plans[-1], model)
    interfaces = {p.name: _interface(p) for p in plans}
    ensembles = check_spec_ensembles(spec, interfaces)
    repo.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        _refuse_stall(plan, templates)
        write_model(repo, plan.context, plan.files, templates=templates, warmup_files=plan.warmup_files,
                    versions=plan.version_files or None)
    fusions = fuse_spec_ensembles(spec, plans, ensembles, templates) if fuse else {}
    for fusion in fusions.values():
        for line in fusion.summary():
            log(line)
    write_ensembles(repo, ensembles, fusions, templates)
    points = plan_operating_points(spec, plans, profiles_dir)
    for fused in derive_fused(spec, repo, fusions, plans, profiles_dir, templates, log):
        log(derivation_report(fused.name, fused.derivation))
        # What verify and tune drive the fused model at: its own derivation, against the ensemble's SLO.
        points[fused.name] = OperatingPoint(slo_ms=fused.derivation.slo_ms, rate=fused.derivation.planned_rate,
                                            rate_source="derived", profile=str(fused.profile_path))
    write_operating_points(repo, points)
    validate_repository(repo)
    return plans
