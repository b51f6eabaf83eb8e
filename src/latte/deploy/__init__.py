"""Deploying a latte model repository beyond one machine: Kubernetes manifests and the image."""

from latte.deploy.errors import DeployError, ManifestInvalid
from latte.deploy.k8s import RenderedDeployment, render_dockerfile, render_k8s
from latte.deploy.options import DEFAULT_TRITON_IMAGE, K8sOptions
from latte.deploy.sizing import replicas_for_rate

__all__ = ["DEFAULT_TRITON_IMAGE", "DeployError", "K8sOptions", "ManifestInvalid", "RenderedDeployment",
           "render_dockerfile", "render_k8s", "replicas_for_rate"]
