"""Render Kubernetes manifests that serve a latte model repository with Triton.

    OUT/deployment.yaml service.yaml hpa.yaml pdb.yaml   `kubectl apply -f OUT/`
    OUT/networkpolicy.yaml                               who may reach the pods (unless --no-network-policy)
    OUT/inferenceservice.yaml                            instead of those four, with --kserve
    OUT/prometheus-adapter/values.yaml                   the custom-metrics rule the HPA reads
    OUT/monitoring/*.yaml                                the ServiceMonitor (or PodMonitor), the alerts and the
                                                         dashboard's ConfigMap (monitoring.py)
    OUT/grafana/dashboard.json                           the dashboard, to import by hand
    OUT/image/Dockerfile                                 the Latte-on-Triton image the pods run (`latte serve`)
    OUT/README.md                                        the commands, in order

Every manifest is checked against its API schema before this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from latte.deploy.errors import DeployError
from latte.deploy.options import DEFAULT_TRITON_IMAGE, K8sOptions
from latte.deploy.repository import RepositoryFacts, read_repository
from latte.deploy.sizing import canary_replicas
from latte.triton.cache import cache_bytes, cache_flag
from latte.triton.security import ADMIN_APIS, ADMIN_HEADER, GRPC_ADMIN_HEADER, restricted_api_args

TRITON_VERSION = "2.51"
# health: `latte serve`'s own endpoint (/ready, /live, and /metrics with the supervisor's series).
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "health": 8003}
EXIT_TIMEOUT_S = 30
# Pods get this long (x STARTUP_PERIOD_S) to load every model before the startup probe gives up.
STARTUP_FAILURE_THRESHOLD = 120
STARTUP_PERIOD_S = 5
# The NGC image's Triton, and the backend directory the Dockerfile lays out in it: latte serve
# finds both there instead of installing a backend under the read-only root.
TRITON_ROOT = "/opt/tritonserver"
BACKEND_DIRECTORY = f"{TRITON_ROOT}/backends"
# Where latte serve keeps what outlives a model's process (in-flight inputs, the inputs that crashed
# it, sessions' last turns). An emptyDir outlives the container's restarts within the pod, so an
# input that crashed a model stays refused when the kubelet restarts the container.
STATE_DIR = "/var/lib/latte"
STATE_VOLUME = "latte-state"
# Triton's own log, in the writable /tmp; latte serve prints its supervision (deaths with their
# signal or exit code, restarts) to the container's output.
TRITON_LOG = "/tmp/tritonserver.log"
# latte serve's defaults, written out so that the manifest says what the pods do.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600
GCS_CREDENTIALS_DIR = "/var/run/secrets/latte-storage"
# The runtimes a Dockerfile installs when it is rendered without a repository.
DEFAULT_RUNTIME_PACKAGES = ("onnxruntime", "torch")

MANIFESTS = ("deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml")
KSERVE_MANIFESTS = ("inferenceservice.yaml",)
NETWORK_POLICY = "networkpolicy.yaml"
# The admin header's value: a Secret's key, handed to tritonserver's flags through this variable
# (the kubelet expands $(VAR) in args), so no manifest holds it.
ADMIN_TOKEN_ENV = "LATTE_ADMIN_TOKEN"
ADMIN_SECRET_KEY = "token"
# With a read-only root filesystem, where tritonserver, the Python backend's stubs and the
# runtimes still write (temporary files, caches under HOME); /dev/shm is its own volume.
WRITABLE_DIRS = {"tmp": "/tmp"}
# KServe's data plane (Knative's activator, the Istio gateway) forwards requests to its pods.
KSERVE_DATA_PLANE_NAMESPACES = ("knative-serving", "istio-system")
# Beside a running deployment of the same --name: its Service reaches these pods too.
CANARY_MANIFESTS = ("canary.yaml",)
METRICS = {
    "queue-time": ("latte_queue_time_us_per_request",
                   "Scales on the average time a request waits in Triton's queue (microseconds), per pod."),
    "pending": ("latte_pending_requests",
                "Scales on requests waiting in Triton's scheduler (nv_inference_pending_request_count), per pod."),
}


@dataclass(frozen=True)
class RenderedDeployment:
    out_dir: Path
    manifests: List[Path]         # what `kubectl apply -f` takes
    files: List[Path]             # everything written
    repository: RepositoryFacts
    gpus: int
    cpu: str
    options: K8sOptions
    canary_replicas: Optional[int] = None   # with --canary-percent, without KServe
    canary_share: Optional[float] = None    # % of the pods (and of the traffic) the canary gets at the minimum


def _gpus(options: K8sOptions, facts: RepositoryFacts) -> int:
    needed = facts.gpus_needed
    if options.gpus is None:
        return needed
    if options.gpus < needed:
        raise DeployError(
            f"--gpus {options.gpus} is too few: model(s) {', '.join(facts.gpu_models)} use KIND_GPU instance "
            f"groups that need {needed} GPU(s) per pod; pass --gpus {needed} or more, or change their "
            "instance_group to KIND_CPU"
        )
    return options.gpus


def _model_source(options: K8sOptions) -> Dict:
    """Triton's --model-repository argument, and the volume or credentials that back it."""
    uri = options.model_uri
    source = {"model_repository": uri, "model_volume": None, "storage_env": {},
              "storage_secret": options.storage_secret, "storage_secret_as_file": False,
              "storage_secret_mount": GCS_CREDENTIALS_DIR}
    if uri.startswith("pvc://"):
        if options.storage_secret:
            raise DeployError("--storage-secret is for s3://, gs:// and as:// model locations; "
                              "a pvc:// volume needs no credentials")
        claim, _, sub_path = uri[len("pvc://"):].partition("/")
        source["model_repository"] = "/models"
        source["model_volume"] = {"claim": claim, "sub_path": sub_path.strip("/"), "mount_path": "/models"}
    elif uri.startswith("gs://") and options.storage_secret:
        # Triton's GCS client reads a service-account key file named by this variable.
        source["storage_secret_as_file"] = True
        source["storage_env"] = {"GOOGLE_APPLICATION_CREDENTIALS": f"{GCS_CREDENTIALS_DIR}/key.json"}
    return source


def manifest_context(options: K8sOptions, facts: RepositoryFacts) -> Dict:
    """Everything the k8s/ templates read; `options` must be checked already."""
    gpus = _gpus(options, facts)
    if options.scale_metric == "queue-time" and options.target_queue_us <= facts.max_queue_delay_us:
        raise DeployError(
            f"--target-queue-us {options.target_queue_us} is not above the longest dynamic-batching delay of the "
            f"repository ({facts.max_queue_delay_us} us): every request would count as late and the autoscaler "
            "would only ever scale up; choose a target several times that delay"
        )
    metric_name, description = METRICS[options.scale_metric]
    target = options.target_queue_us if options.scale_metric == "queue-time" else options.target_pending
    selector = {"app.kubernetes.io/name": "latte-triton", "app.kubernetes.io/instance": options.name}
    # The Service selects by application, not by Deployment, so a canary Deployment's pods share its traffic.
    application = {"app.kubernetes.io/name": "latte-triton", "app.kubernetes.io/part-of": options.name}
    cache = cache_bytes(options.response_cache_bytes, bool(facts.cache_models))
    return {
        "name": options.name,
        "namespace": options.namespace,
        "labels": {**selector, **application, "app.kubernetes.io/component": "inference-server",
                   "app.kubernetes.io/managed-by": "latte"},
        "selector_labels": selector,
        "service_selector": application,
        "replicas": None,
        "canary_percent": options.canary_percent,
        "cache_flag": cache_flag(cache) if cache else None,
        "cache_models": facts.cache_models,
        "image": options.image,
        "triton_image": options.triton_image,
        "triton_version": TRITON_VERSION,
        "models": [m.name for m in facts.models],
        "model_uri": options.model_uri,
        **_model_source(options),
        "service_account": options.service_account,
        "gpus": gpus,
        "gpu_resource": options.gpu_resource,
        "cpu": options.cpu or str(max(1, facts.cpu_threads)),
        "memory": options.memory,
        "shm_size": options.shm_size,
        "min_replicas": options.min_replicas,
        "max_replicas": options.max_replicas,
        "metric": {"kind": options.scale_metric, "name": metric_name, "target": target, "description": description},
        "target_pending": options.target_pending,
        "ports": PORTS,
        "exit_timeout_s": EXIT_TIMEOUT_S,
        "startup_failure_threshold": STARTUP_FAILURE_THRESHOLD,
        "startup_period_s": STARTUP_PERIOD_S,
        "serve": serve_context(gpus, cache),
        "runtime_packages": facts.python_packages,
        "kserve": options.kserve,
        "kubernetes_version": options.kubernetes_version,
        "security": security_context(options),
    }


def serve_context(gpus: int, cache: int) -> Dict:
    """How the Deployment's container runs `latte serve`: its own settings, and the flags it passes
    to tritonserver unchanged (those latte serve does not set itself)."""
    return {
        "state_dir": STATE_DIR,
        "state_volume": STATE_VOLUME,
        "max_restarts": MAX_RESTARTS,
        "restart_window_s": RESTART_WINDOW_S,
        "timeout_s": STARTUP_FAILURE_THRESHOLD * STARTUP_PERIOD_S,
        "triton_root": TRITON_ROOT,
        "backend_directory": BACKEND_DIRECTORY,
        "log": TRITON_LOG,
        # Stated, never left to latte serve's default, which reads the configs of a local repository:
        # the pods may read theirs from object storage.
        "cache_bytes": cache,
        "triton_args": ["--allow-metrics=true", f"--allow-gpu-metrics={'true' if gpus else 'false'}",
                        f"--exit-timeout-secs={EXIT_TIMEOUT_S}"],
    }


def security_context(options: K8sOptions) -> Dict:
    """What the templates need to make the pods least-privileged and the admin APIs closed."""
    key, _, value = options.client_label.partition("=")
    return {
        "run_as_user": options.run_as_user,
        "read_only_root": not options.writable_root,
        "writable_dirs": WRITABLE_DIRS,
        "admin_args": [] if options.open_admin_apis else restricted_api_args(f"$({ADMIN_TOKEN_ENV})"),
        "admin_secret": None if options.open_admin_apis else options.admin_secret,
        "admin_env": ADMIN_TOKEN_ENV,
        "admin_key": ADMIN_SECRET_KEY,
        "admin_apis": ADMIN_APIS,
        "admin_header": ADMIN_HEADER,
        "grpc_admin_header": GRPC_ADMIN_HEADER,
        "network_policy": options.network_policy,
        "client_label": {key: value},
        "monitoring_namespace": options.monitoring_namespace,
        "data_plane_namespaces": KSERVE_DATA_PLANE_NAMESPACES if options.kserve else (),
    }


def canary_context(ctx: Dict) -> Dict:
    """The stable context turned into a fixed-size Deployment NAME-canary, whose pods the stable
    Service (selecting part-of: NAME) reaches, but not the stable HPA or PDB (instance: NAME)."""
    name = f"{ctx['name']}-canary"
    selector = {**ctx["selector_labels"], "app.kubernetes.io/instance": name}
    stable = ctx["min_replicas"]
    replicas = canary_replicas(stable, ctx["canary_percent"])
    return {**ctx, "name": name, "stable_name": ctx["name"], "selector_labels": selector,
            "labels": {**ctx["labels"], **selector}, "replicas": replicas, "stable_replicas": stable,
            "canary_share": round(100 * replicas / (stable + replicas), 1)}


def render_dockerfile(triton_image: str = DEFAULT_TRITON_IMAGE, runtime_packages: Optional[List[str]] = None,
                      dockerfile_path: str = "deploy/Dockerfile", context_path: str = ".") -> str:
    """The Latte-on-Triton Dockerfile; deploy/Dockerfile in the source tree is this with the defaults."""
    from latte.generator.templates import render

    return render("k8s/Dockerfile.j2", {
        "triton_image": triton_image,
        "triton_root": TRITON_ROOT,
        "backend_directory": BACKEND_DIRECTORY,
        "state_dir": STATE_DIR,
        "runtime_packages": list(DEFAULT_RUNTIME_PACKAGES if runtime_packages is None else runtime_packages),
        "dockerfile_path": dockerfile_path,
        "context_path": context_path,
    })


def _write(path: Path, text: str, written: List[Path]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    written.append(path)
    return path


def _write_monitoring(out_dir: Path, options: K8sOptions, facts: RepositoryFacts, ctx: Dict,
                      written: List[Path]) -> List[str]:
    """OUT/monitoring/ and OUT/grafana/ as the options ask; a file the options leave out goes."""
    import json

    import yaml

    from latte.deploy import monitoring

    name, namespace = options.name, options.namespace or ""
    labels = dict(ctx["labels"])
    if options.monitor_label:  # kube-prometheus-stack, for one, selects its monitors and rules by a label
        key, _, value = options.monitor_label.partition("=")
        labels[key] = value
    pod_monitor = options.pod_monitor
    selector = ctx["selector_labels"] if pod_monitor else ctx["labels"]
    # KServe's runtime declares no metrics port a monitor could name: its pods are scraped the way
    # the KServe install does; the rules and the dashboard still apply.
    scrape = options.scrape_monitor and not options.kserve
    board = monitoring.dashboard(name)
    settings = monitoring.AlertSettings(slo_ms=monitoring.slo_by_model(facts.models, options.slo_ms),
                                        forecast_horizon_h=options.forecast_horizon_h, error_ratio=options.error_ratio,
                                        rss_growth_mib_per_h=options.rss_growth_mib_per_h)
    wanted = {
        "monitoring/servicemonitor.yaml": scrape and not pod_monitor,
        "monitoring/podmonitor.yaml": scrape and pod_monitor,
        "monitoring/prometheusrule.yaml": options.alerts,
        "monitoring/dashboard-configmap.yaml": options.dashboard,
        "grafana/dashboard.json": options.dashboard,
    }
    objects = {
        "monitoring/servicemonitor.yaml": lambda: monitoring.scrape_monitor(name, namespace, labels, selector, False),
        "monitoring/podmonitor.yaml": lambda: monitoring.scrape_monitor(name, namespace, labels, selector, True),
        "monitoring/prometheusrule.yaml": lambda: monitoring.prometheus_rule(name, namespace, labels, settings),
        "monitoring/dashboard-configmap.yaml": lambda: monitoring.dashboard_configmap(name, namespace, labels, board),
    }
    for relative, keep in wanted.items():
        path = out_dir / relative
        if not keep:
            path.unlink(missing_ok=True)
        elif relative.endswith(".json"):
            _write(path, json.dumps(board, indent=1) + "\n", written)
        else:
            _write(path, yaml.safe_dump(objects[relative](), sort_keys=False, width=120), written)
    return [relative for relative, keep in wanted.items() if keep]


def render_k8s(repo: Path, out_dir: Path, options: K8sOptions, validate: bool = True) -> RenderedDeployment:
    """Render (and by default validate) the manifests serving REPO into OUT_DIR."""
    from latte.generator.templates import render

    options = options.checked()
    facts = read_repository(Path(repo))
    ctx = manifest_context(options, facts)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DeployError(f"output {out_dir} exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    split_by_replicas = options.canary_percent is not None and not options.kserve
    names = KSERVE_MANIFESTS if options.kserve else CANARY_MANIFESTS if split_by_replicas else MANIFESTS
    if options.network_policy and not split_by_replicas:  # a canary's pods are the stable policy's too
        names = names + (NETWORK_POLICY,)
    # A manifest left from a render of the other kind would be applied along with these.
    for stale in set(MANIFESTS + KSERVE_MANIFESTS + CANARY_MANIFESTS + (NETWORK_POLICY,)) - set(names):
        (out_dir / stale).unlink(missing_ok=True)
    written: List[Path] = []
    if split_by_replicas:
        ctx = canary_context(ctx)
        manifests = [_write(out_dir / "canary.yaml", render("k8s/deployment.yaml.j2", ctx), written)]
    else:
        manifests = [_write(out_dir / n, render(f"k8s/{n.replace('.yaml', '')}.yaml.j2", ctx), written)
                     for n in names]
    adapter = out_dir / "prometheus-adapter" / "values.yaml"
    if options.kserve or split_by_replicas:
        adapter.unlink(missing_ok=True)
    else:
        _write(adapter, render("k8s/prometheus-adapter-values.yaml.j2", ctx), written)
    monitoring_files = []
    if not split_by_replicas:  # a canary's pods are watched by the stable deployment's objects
        monitoring_files = _write_monitoring(out_dir, options, facts, ctx, written)
    dockerfile = render_dockerfile(options.triton_image, ctx["runtime_packages"],
                                   str(out_dir / "image" / "Dockerfile"), "/path/to/latte-checkout")
    _write(out_dir / "image" / "Dockerfile", dockerfile, written)
    _write(out_dir / "image" / "Dockerfile.dockerignore", render("k8s/Dockerfile.dockerignore.j2", ctx), written)
    _write(out_dir / "README.md", render("k8s/README.md.j2", {**ctx, "out_dir": str(out_dir), "repo": str(facts.path),
                                                               "monitoring_files": monitoring_files}), written)
    if validate:
        from latte.deploy.validation import validate_files

        validate_files(manifests, options.kubernetes_version)
    return RenderedDeployment(out_dir=out_dir, manifests=manifests, files=written, repository=facts,
                              gpus=ctx["gpus"], cpu=ctx["cpu"], options=options,
                              canary_replicas=ctx.get("replicas"), canary_share=ctx.get("canary_share"))
