"""Check rendered manifests against their API schemas, offline.

Core Kubernetes kinds are checked with kubernetes-validate's strict schemas (an
unknown field is an error, as `kubectl apply --validate=strict` would make it);
KServe's InferenceService with the JSON schema shipped in latte/deploy/schemas.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, List, Mapping

import yaml

from latte.deploy.errors import DeployError, ManifestInvalid

KSERVE_SCHEMA = Path(__file__).resolve().parent / "schemas" / "inferenceservice-v1beta1.schema.json"
_OLDEST_SCHEMAS = 25  # kubernetes-validate 1.37 ships schemas for 1.25 .. 1.37


def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        raise DeployError("validating manifests needs kubernetes-validate and jsonschema: "
                          "pip install 'kubernetes-validate==1.37.0' 'jsonschema>=4.23' (or latte[deploy])") from None
    return kubernetes_validate


def _check_version(version: str) -> None:
    kubernetes_validate = _kubernetes_validate()
    match = re.match(r"^1\.([0-9]+)\.[0-9]+$", version)
    newest = kubernetes_validate.latest_version()
    # Compared as numbers: the library compares "1.9" and "1.37" as strings.
    if not match or not _OLDEST_SCHEMAS <= int(match.group(1)) <= int(newest.split(".")[1]):
        raise DeployError(f"Kubernetes {version!r} has no schemas here; expected a version from 1.{_OLDEST_SCHEMAS}.0 "
                          f"to {newest}")


def _where(error) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def validate_resource(resource: Mapping, kubernetes_version: str, source: str = "manifest") -> None:
    """Raise ManifestInvalid naming source, kind/name and the failing field."""
    if not isinstance(resource, Mapping) or "apiVersion" not in resource or "kind" not in resource:
        raise ManifestInvalid(f"{source}: not a Kubernetes object (apiVersion and kind are required)")
    label = f"{source}: {resource['kind']}/{(resource.get('metadata') or {}).get('name', '?')}"
    if str(resource["apiVersion"]).startswith("serving.kserve.io/"):
        _kubernetes_validate()  # brings jsonschema along
        import jsonschema

        schema = json.loads(KSERVE_SCHEMA.read_text())
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(dict(resource)),
                        key=lambda e: list(e.absolute_path))
        if errors:
            raise ManifestInvalid(f"{label} does not match KServe's InferenceService v1beta1 schema at "
                                  f"{_where(errors[0])}: {errors[0].message}")
        return
    kubernetes_validate = _kubernetes_validate()
    _check_version(kubernetes_version)
    try:
        kubernetes_validate.validate(dict(resource), kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise ManifestInvalid(f"{label} does not match Kubernetes {exc.version} at {_where(exc)}: "
                              f"{exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise ManifestInvalid(f"{label}: {exc.message}") from None


def load_manifests(path: Path) -> List[Mapping]:
    try:
        return [doc for doc in yaml.safe_load_all(Path(path).read_text()) if doc]
    except yaml.YAMLError as exc:
        raise ManifestInvalid(f"{path}: not valid YAML: {exc}") from None


def validate_files(paths: Iterable[Path], kubernetes_version: str) -> int:
    """Validate every object in every file; returns how many objects were checked."""
    checked = 0
    for path in paths:
        for resource in load_manifests(path):
            validate_resource(resource, kubernetes_version, str(path))
            checked += 1
    return checked
