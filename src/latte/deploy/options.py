"""The choices behind a Kubernetes deployment, each checked with a clear error."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

from latte.deploy.errors import DeployError

# Triton 2.51 is the release that NGC ships as 24.10; the project is tested against 2.51.
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
SCALE_METRICS = ("queue-time", "pending")
REMOTE_SCHEMES = ("s3://", "gs://", "as://")

# A Service name is an RFC 1035 label: every other resource name here derives from it.
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$")
# registry[:port]/path[:tag][@sha256:digest], lower-case path components as the registry API requires.
_IMAGE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
_PVC = re.compile(r"^pvc://([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(/.*)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class K8sOptions:
    """Everything `latte deploy k8s` can be told; `checked()` returns a validated copy."""

    image: Optional[str] = None                  # the Latte-on-Triton image the pods run
    triton_image: str = DEFAULT_TRITON_IMAGE     # the base the Dockerfile builds on
    name: str = "latte"
    namespace: Optional[str] = None
    model_uri: Optional[str] = None              # s3://, gs://, as:// or pvc://CLAIM[/sub/path]
    storage_secret: Optional[str] = None         # credentials for s3/gs/as
    service_account: Optional[str] = None
    gpus: Optional[int] = None                   # None: as many as the KIND_GPU groups need
    gpu_resource: str = "nvidia.com/gpu"
    cpu: Optional[str] = None                    # None: the latte models' thread count
    memory: str = "4Gi"
    shm_size: str = "1Gi"
    min_replicas: int = 2
    max_replicas: Optional[int] = None           # None: twice min_replicas
    scale_metric: str = "queue-time"
    target_queue_us: int = 10000                 # average queue time per request, per pod
    target_pending: int = 16                     # requests waiting, per pod
    kserve: bool = False
    kubernetes_version: str = "1.33.0"
    canary_percent: Optional[int] = None         # render a canary of this share beside a running deployment
    response_cache_bytes: Optional[int] = None   # None: the default when a model enables response_cache
    # Secure by default (docs/scale-out.md, "Security"); each relaxation is one of these.
    run_as_user: int = 1000                      # the NGC image's triton-server user
    writable_root: bool = False                  # --writable-root-filesystem: for a model that writes next to itself
    admin_secret: Optional[str] = None           # the Secret holding the admin header's value; None: NAME-admin
    open_admin_apis: bool = False                # --open-admin-apis: no header asked of Triton's admin APIs
    network_policy: bool = True                  # --no-network-policy
    client_label: str = "latte.dev/client=true"  # the pods (any namespace) that may call HTTP and gRPC
    monitoring_namespace: str = "monitoring"     # the namespace whose pods may scrape the metrics and health ports
    # What an operator watches (monitoring.py); each object can be left out.
    scrape_monitor: bool = True                  # --no-scrape-monitor
    pod_monitor: bool = False                    # --pod-monitor: a PodMonitor instead of a ServiceMonitor
    monitor_label: Optional[str] = None          # KEY=VALUE the Operator selects its monitors and rules by
    alerts: bool = True                          # --no-alerts
    dashboard: bool = True                       # --no-dashboard
    slo_ms: float = 100.0                        # a model's P95 bound where its config sets no slo_ms
    forecast_horizon_h: float = 6.0              # how far ahead the P95 trend alert looks
    error_ratio: float = 0.01                    # failed requests / all that alert, over 5 minutes
    rss_growth_mib_per_h: float = 256.0          # resident memory growth per hour that alerts

    def checked(self) -> "K8sOptions":
        if not self.image:
            raise DeployError(
                "an image is required: pass --image REGISTRY/NAME:TAG, the reference you push the Latte "
                "image to (built from deploy/Dockerfile of a latte checkout, the same file this command "
                "writes to OUT/image/Dockerfile)"
            )
        for what, ref in (("--image", self.image), ("--triton-image", self.triton_image)):
            if not _IMAGE.match(ref):
                raise DeployError(f"{what} {ref!r} is not an image reference; expected REGISTRY/PATH:TAG, "
                                  "e.g. registry.example.com/ml/latte-triton:0.1.0")
        if not _NAME.match(self.name or ""):
            raise DeployError(f"--name {self.name!r} must be a DNS label: lower-case letters, digits and '-', "
                              "starting with a letter, at most 52 characters")
        for what, value in (("--namespace", self.namespace), ("--storage-secret", self.storage_secret),
                            ("--service-account", self.service_account)):
            if value is not None and not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", value):
                raise DeployError(f"{what} {value!r} must be a DNS label (lower-case letters, digits and '-')")
        uri = self.model_uri or f"pvc://{self.name}-models"
        if not (uri.startswith(REMOTE_SCHEMES) or _PVC.match(uri)):
            raise DeployError(
                f"--model-uri {uri!r} is not a location a pod can read; expected s3://BUCKET/PATH, gs://BUCKET/PATH, "
                "as://ACCOUNT/CONTAINER/PATH (read by Triton itself) or pvc://CLAIM[/PATH] (a PersistentVolumeClaim)"
            )
        if uri.startswith(REMOTE_SCHEMES) and len(uri.rstrip("/")) <= 5:
            raise DeployError(f"--model-uri {uri!r} names no bucket")
        if self.kserve and uri.startswith("as://"):
            raise DeployError("KServe's storage initializer reads Azure blobs as "
                              "https://ACCOUNT.blob.core.windows.net/CONTAINER/PATH, not as://; "
                              "use that form or drop --kserve")
        if self.kserve and self.storage_secret:
            raise DeployError("with --kserve, KServe's storage initializer takes credentials from the ServiceAccount "
                              "(--service-account) whose secrets carry them; --storage-secret is for the Deployment")
        if self.gpus is not None and (isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0):
            raise DeployError(f"--gpus must be a whole number >= 0, got {self.gpus!r}")
        if not _RESOURCE_NAME.match(self.gpu_resource):
            raise DeployError(f"--gpu-resource {self.gpu_resource!r} is not an extended resource name "
                              "such as nvidia.com/gpu")
        for what, value in (("--cpu", self.cpu), ("--memory", self.memory), ("--shm-size", self.shm_size)):
            if value is not None and not _QUANTITY.match(str(value)):
                raise DeployError(f"{what} {value!r} is not a Kubernetes quantity such as 2, 500m, 4Gi")
        if not isinstance(self.min_replicas, int) or self.min_replicas < 1:
            raise DeployError(f"--min-replicas must be >= 1, got {self.min_replicas!r}")
        max_replicas = self.max_replicas if self.max_replicas is not None else 2 * self.min_replicas
        if not isinstance(max_replicas, int) or max_replicas < self.min_replicas:
            raise DeployError(f"--max-replicas ({max_replicas!r}) must be >= --min-replicas ({self.min_replicas})")
        if self.scale_metric not in SCALE_METRICS:
            raise DeployError(f"--scale-metric {self.scale_metric!r}: expected one of {', '.join(SCALE_METRICS)}")
        for what, value in (("--target-queue-us", self.target_queue_us), ("--target-pending", self.target_pending)):
            if not isinstance(value, int) or value < 1:
                raise DeployError(f"{what} must be a whole number >= 1, got {value!r}")
        if self.canary_percent is not None:
            low = 0 if self.kserve else 1
            high = 100 if self.kserve else 99
            if isinstance(self.canary_percent, bool) or not isinstance(self.canary_percent, int) \
                    or not low <= self.canary_percent <= high:
                raise DeployError(f"--canary-percent must be a whole number from {low} to {high}"
                                  f"{'' if self.kserve else ' (a split by replicas needs pods on both sides)'}, "
                                  f"got {self.canary_percent!r}")
        if self.response_cache_bytes is not None and (isinstance(self.response_cache_bytes, bool) or
                                                      not isinstance(self.response_cache_bytes, int) or
                                                      self.response_cache_bytes < 0):
            raise DeployError(f"--response-cache-size must be bytes >= 0, got {self.response_cache_bytes!r}")
        if isinstance(self.run_as_user, bool) or not isinstance(self.run_as_user, int) or self.run_as_user < 1:
            raise DeployError(f"--run-as-user must be a user id >= 1 (0 is root, which the pods must not run as), "
                              f"got {self.run_as_user!r}")
        admin_secret = self.admin_secret or f"{self.name}-admin"
        if not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", admin_secret):
            raise DeployError(f"--admin-secret {admin_secret!r} must be a Secret name (lower-case letters, digits, "
                              "'-' and '.')")
        key, sep, value = self.client_label.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise DeployError(f"--client-label {self.client_label!r} must be KEY=VALUE, a label the client pods "
                              "carry, e.g. latte.dev/client=true")
        if not re.match(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", self.monitoring_namespace or ""):
            raise DeployError(f"--monitoring-namespace {self.monitoring_namespace!r} must be a namespace name")
        for what, value in (("--slo-ms", self.slo_ms), ("--forecast-horizon-h", self.forecast_horizon_h),
                            ("--alert-error-ratio", self.error_ratio),
                            ("--alert-rss-growth-mib-per-h", self.rss_growth_mib_per_h)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise DeployError(f"{what} must be a number > 0, got {value!r}")
        if self.monitor_label is not None:
            key, sep, value = self.monitor_label.partition("=")
            if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise DeployError(f"--monitor-label {self.monitor_label!r} must be KEY=VALUE, the label your "
                                  "Prometheus Operator selects monitors and rules by, e.g. release=prometheus")
        if self.error_ratio >= 1:
            raise DeployError(f"--alert-error-ratio is a share of requests, below 1; got {self.error_ratio!r}")
        if not re.match(r"^1\.[0-9]+\.[0-9]+$", self.kubernetes_version):
            raise DeployError(f"--kubernetes-version {self.kubernetes_version!r}: expected 1.MINOR.PATCH, e.g. 1.33.0")
        return replace(self, model_uri=uri, max_replicas=max_replicas, admin_secret=admin_secret)
