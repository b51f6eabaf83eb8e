"""`latte deploy k8s`: manifests for real repositories, validated against the Kubernetes and KServe schemas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from latte.cli import main
from latte.deploy import DeployError, K8sOptions, ManifestInvalid, render_dockerfile, render_k8s, replicas_for_rate
from latte.deploy.validation import load_manifests, validate_files, validate_resource
from latte.generator.model_folder import write_model

IMAGE = "registry.example.com/ml/latte-triton:0.1.0"
SOURCE_TREE = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def examples_repo(tmp_path_factory):
    from latte.examples import build_examples

    return build_examples(tmp_path_factory.mktemp("examples") / "repo")


def latte_model(repo: Path, name: str, runtime: str = "onnx", groups=None, delay_us: int = 100) -> Path:
    """One latte model config, written the way the generator writes it."""
    return write_model(repo, {
        "name": name,
        "backend": "latte",
        "max_batch_size": 8,
        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "instance_groups": groups or [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"model_file": "model.onnx" if runtime == "onnx" else "model.pt", "runtime": runtime,
                       "intra_op_threads": "2"},
    }, files={})


def by_kind(out: Path) -> dict:
    docs = {}
    for path in sorted(out.glob("*.yaml")):
        for doc in load_manifests(path):
            docs[doc["kind"]] = doc
    return docs


def container_of(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def serve_and_triton_args(container: dict):
    """`latte serve`'s own arguments, and those it passes on to tritonserver (after `--`)."""
    args = container["args"]
    return args[:args.index("--")], args[args.index("--") + 1:]


# --- every example repository renders and validates ---------------------------------------------------------


def test_example_repository_renders_a_validated_deployment(examples_repo, tmp_path):
    result = render_k8s(examples_repo, tmp_path / "k8s", K8sOptions(image=IMAGE))

    assert [p.name for p in result.manifests] == ["deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml",
                                                  "networkpolicy.yaml"]
    assert validate_files(result.manifests, "1.37.0") == 5  # also valid for the newest schemas shipped
    docs = by_kind(tmp_path / "k8s")
    assert set(docs) == {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}

    deployment = docs["Deployment"]
    pod = deployment["spec"]["template"]
    container = container_of(deployment)
    assert container["image"] == IMAGE
    assert container["command"] == ["latte", "serve"] and container["args"][0] == "/models"
    # The supervisor answers the probes on its health port, not Triton.
    assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "health"}
    assert container["startupProbe"]["httpGet"] == {"path": "/ready", "port": "health"}
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    # The examples run KIND_CPU instances: no GPU is asked for, CPU matches their 6 x 1 threads.
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    assert container["resources"]["requests"]["cpu"] == "6"
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["model-repository"]["persistentVolumeClaim"][
        "claimName"] == "latte-models"
    assert {p["name"]: p["port"] for p in docs["Service"]["spec"]["ports"]} == {"http": 8000, "grpc": 8001,
                                                                                "metrics": 8002, "health": 8003}
    # Service, PDB and HPA all point at the pods the Deployment makes.
    labels = pod["metadata"]["labels"]
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_autoscaler_reads_the_metric_the_adapter_rule_defines(examples_repo, tmp_path):
    for metric, series in (("queue-time", "nv_inference_queue_duration_us"),
                           ("pending", "nv_inference_pending_request_count")):
        out = tmp_path / metric
        render_k8s(examples_repo, out, K8sOptions(image=IMAGE, scale_metric=metric, min_replicas=3))
        hpa = by_kind(out)["HorizontalPodAutoscaler"]["spec"]
        (rule,) = yaml.safe_load((out / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
        assert hpa["metrics"][0]["pods"]["metric"]["name"] == rule["name"]["as"]
        assert series in rule["seriesQuery"]
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 6)


def test_example_repository_renders_a_validated_kserve_inference_service(examples_repo, tmp_path):
    out = tmp_path / "kserve"
    result = render_k8s(examples_repo, out, K8sOptions(image=IMAGE, kserve=True, model_uri="s3://models/latte"))

    assert [p.name for p in result.manifests] == ["inferenceservice.yaml", "networkpolicy.yaml"]
    (isvc,) = load_manifests(out / "inferenceservice.yaml")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "triton"
    assert model["runtime"] == "kserve-tritonserver"
    assert model["storageUri"] == "s3://models/latte"
    assert model["image"] == IMAGE
    assert not (out / "prometheus-adapter" / "values.yaml").exists()


def test_every_manifest_lands_in_the_namespace_given(examples_repo, tmp_path):
    render_k8s(examples_repo, tmp_path / "k8s", K8sOptions(image=IMAGE, namespace="serving", name="ranker"))
    render_k8s(examples_repo, tmp_path / "kserve", K8sOptions(image=IMAGE, namespace="serving", kserve=True))
    docs = [*by_kind(tmp_path / "k8s").values(), *by_kind(tmp_path / "kserve").values()]
    assert len(docs) == 7  # five for the Deployment, two for KServe (each with its NetworkPolicy)
    assert {d["metadata"]["namespace"] for d in docs} == {"serving"}
    assert "namespaces/serving/pods/*/" in (tmp_path / "k8s" / "prometheus-adapter" / "values.yaml").read_text()


def test_switching_to_kserve_removes_the_manifests_it_replaces(examples_repo, tmp_path):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE))
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kserve=True))
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == ["inferenceservice.yaml", "networkpolicy.yaml"]
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kserve=True, network_policy=False))
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == ["inferenceservice.yaml"]


# --- the validators can fail -------------------------------------------------------------------------------


def test_a_misspelt_field_fails_kubernetes_validation(examples_repo, tmp_path):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE))
    (deployment,) = load_manifests(tmp_path / "deployment.yaml")
    container_of(deployment)["livenesProbe"] = container_of(deployment).pop("livenessProbe")
    with pytest.raises(ManifestInvalid, match="Deployment/latte .*livenesProbe"):
        validate_resource(deployment, "1.33.0", "deployment.yaml")
    (service,) = load_manifests(tmp_path / "service.yaml")
    service["spec"]["ports"][0]["port"] = "http"
    with pytest.raises(ManifestInvalid, match=r"Service/latte .*spec\.ports\.0\.port"):
        validate_resource(service, "1.33.0", "service.yaml")


def test_a_wrong_inference_service_fails_the_kserve_schema(examples_repo, tmp_path):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kserve=True))
    (isvc,) = load_manifests(tmp_path / "inferenceservice.yaml")
    isvc["spec"]["predictor"]["scaleMetric"] = "queue"
    with pytest.raises(ManifestInvalid, match="scaleMetric"):
        validate_resource(isvc, "1.33.0", "inferenceservice.yaml")
    del isvc["spec"]["predictor"]["scaleMetric"]
    isvc["spec"]["predictor"]["model"]["storageURI"] = isvc["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(ManifestInvalid, match="storageURI"):
        validate_resource(isvc, "1.33.0", "inferenceservice.yaml")


def test_kubernetes_versions_without_schemas_are_refused(examples_repo, tmp_path):
    with pytest.raises(DeployError, match="1.25.0 to 1.37"):
        render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kubernetes_version="1.9.0"))


# --- latte serve supervises the models -----------------------------------------------------------------------

# Flags `latte serve` sets on tritonserver itself: given again after `--` they would contradict it.
SERVE_OWNS = ("--model-repository", "--backend-directory", "--http-port", "--grpc-port", "--metrics-port",
              "--http-address", "--grpc-address", "--http-restricted-api", "--grpc-restricted-protocol",
              "--strict-readiness", "--exit-on-error", "--cache-config", "--model-control-mode", "--load-model")
# The supervisor's flags, which `latte serve` declares once supervision is in.
SUPERVISOR_FLAGS = {"--health-port", "--state-dir", "--max-restarts", "--restart-window"}


def serve_options() -> set:
    import argparse

    from latte.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {flag for action in sub.choices["serve"]._actions for flag in action.option_strings}


def test_the_container_runs_latte_serve_with_the_supervisors_state_and_health_port(examples_repo, tmp_path):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE))
    deployment = by_kind(tmp_path)["Deployment"]
    pod, container = deployment["spec"]["template"]["spec"], container_of(deployment)
    own, triton = serve_and_triton_args(container)
    flags = dict(a.split("=", 1) for a in own[1:] if "=" in a)
    assert (own[0], flags["--address"], flags["--health-port"]) == ("/models", "0.0.0.0", "8003")
    assert (flags["--max-restarts"], flags["--restart-window"]) == ("5", "600")
    # The image's Triton and backend directory, which the Dockerfile lays out: nothing to install at start.
    assert (flags["--tritonserver"], flags["--backend-directory"]) == ("/opt/tritonserver",
                                                                       "/opt/tritonserver/backends")
    # The state folder is an emptyDir: it outlives the container's restarts within the pod.
    mount = {m["name"]: m for m in container["volumeMounts"]}["latte-state"]
    assert mount["mountPath"] == flags["--state-dir"] == "/var/lib/latte" and not mount.get("readOnly")
    assert {"name": "latte-state", "emptyDir": {}} in pod["volumes"]
    assert {"name": "health", "containerPort": 8003} in container["ports"]
    # latte serve waits for readiness as long as the startup probe does.
    startup = container["startupProbe"]
    assert int(flags["--timeout"]) == startup["periodSeconds"] * startup["failureThreshold"] == 600
    assert triton == ["--allow-metrics=true", "--allow-gpu-metrics=false", "--exit-timeout-secs=30"]
    assert not [a for a in triton if a.split("=")[0] in SERVE_OWNS]
    # Every flag before `--` is one latte serve takes (or one of the supervisor's).
    assert {a.split("=")[0] for a in own[1:]} - serve_options() - SUPERVISOR_FLAGS == set()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    readme = (tmp_path / "README.md").read_text()
    assert 'curl -s -X POST localhost:8000/v2/repository/models/MODEL/load -H "latte-admin-key: $TOKEN"' in readme
    assert "regex: latte-triton;health" in readme  # the scrape job for annotation-driven Prometheus


def test_latte_serve_parses_the_rendered_command_line(examples_repo, tmp_path):
    from latte.cli import parse_command_line

    missing = SUPERVISOR_FLAGS - serve_options()
    if missing:
        pytest.skip(f"latte serve does not declare {', '.join(sorted(missing))} yet")
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, response_cache_bytes=1 << 20))
    container = container_of(by_kind(tmp_path)["Deployment"])
    token = "0123456789abcdef"  # what the kubelet puts in place of $(LATTE_ADMIN_TOKEN)
    argv = container["command"][1:] + [a.replace("$(LATTE_ADMIN_TOKEN)", token) for a in container["args"]]
    _, args = parse_command_line(argv)
    assert (args.repo, args.address, args.access_token) == ("/models", "0.0.0.0", token)
    assert (int(args.health_port), str(args.state_dir), int(args.max_restarts)) == (8003, "/var/lib/latte", 5)
    assert str(args.response_cache_size) == str(1 << 20)
    assert args.passthrough == serve_and_triton_args(container)[1]


def test_the_image_starts_latte_serve_with_a_state_folder_its_user_owns():
    dockerfile = render_dockerfile()
    assert 'CMD ["latte", "serve", "/models", "--address=0.0.0.0", "--tritonserver=/opt/tritonserver", \\\n' \
           '     "--backend-directory=/opt/tritonserver/backends", "--state-dir=/var/lib/latte"]' in dockerfile
    assert "RUN mkdir -p /var/lib/latte && chown 1000:1000 /var/lib/latte" in dockerfile
    assert dockerfile.index("chown 1000:1000") < dockerfile.index("USER 1000:1000") < dockerfile.index("CMD [")
    assert 'CMD ["tritonserver"' not in dockerfile


# --- GPUs from the models' instance groups ------------------------------------------------------------------


def test_kind_gpu_models_get_gpu_requests_and_tolerations(tmp_path):
    repo = tmp_path / "repo"
    latte_model(repo, "on_cpu")
    latte_model(repo, "on_two_gpus", groups=[{"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}])
    result = render_k8s(repo, tmp_path / "out", K8sOptions(image=IMAGE))

    assert result.gpus == 2
    deployment = by_kind(tmp_path / "out")["Deployment"]
    container = container_of(deployment)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert "--allow-gpu-metrics=true" in serve_and_triton_args(container)[1]
    assert deployment["spec"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert result.cpu == "4"  # two models x one instance x intra_op_threads 2

    render_k8s(repo, tmp_path / "kserve", K8sOptions(image=IMAGE, kserve=True, gpus=4, gpu_resource="amd.com/gpu"))
    predictor = by_kind(tmp_path / "kserve")["InferenceService"]["spec"]["predictor"]
    assert predictor["model"]["resources"]["limits"]["amd.com/gpu"] == "4"
    assert predictor["tolerations"][0]["key"] == "amd.com/gpu"


def test_too_few_gpus_for_the_kind_gpu_groups_is_an_error(tmp_path):
    repo = tmp_path / "repo"
    latte_model(repo, "on_two_gpus", groups=[{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}])
    with pytest.raises(DeployError, match=r"--gpus 1 is too few: model\(s\) on_two_gpus .* need 2 GPU"):
        render_k8s(repo, tmp_path / "out", K8sOptions(image=IMAGE, gpus=1))
    for bad in (-1, "two", 1.5, True):
        with pytest.raises(DeployError, match="--gpus must be a whole number"):
            render_k8s(repo, tmp_path / "out", K8sOptions(image=IMAGE, gpus=bad))


# --- where the models come from -----------------------------------------------------------------------------


def test_object_storage_is_read_by_triton_with_credentials_from_a_secret(tmp_path):
    repo = tmp_path / "repo"
    latte_model(repo, "m")
    render_k8s(repo, tmp_path / "s3", K8sOptions(image=IMAGE, model_uri="s3://bucket/models", storage_secret="aws"))
    container = container_of(by_kind(tmp_path / "s3")["Deployment"])
    assert container["args"][0] == "s3://bucket/models"
    assert container["envFrom"] == [{"secretRef": {"name": "aws"}}]
    assert all(m["name"] != "model-repository" for m in container["volumeMounts"])

    render_k8s(repo, tmp_path / "gs", K8sOptions(image=IMAGE, model_uri="gs://bucket/models", storage_secret="gcp"))
    container = container_of(by_kind(tmp_path / "gs")["Deployment"])
    assert {e["name"]: e.get("value") for e in container["env"]}["GOOGLE_APPLICATION_CREDENTIALS"].endswith("key.json")


def test_a_claim_with_a_sub_path_is_mounted_read_only(tmp_path):
    repo = tmp_path / "repo"
    latte_model(repo, "m")
    render_k8s(repo, tmp_path / "out", K8sOptions(image=IMAGE, model_uri="pvc://shared-models/teams/a"))
    container = container_of(by_kind(tmp_path / "out")["Deployment"])
    mount = {m["name"]: m for m in container["volumeMounts"]}["model-repository"]
    assert (mount["subPath"], mount["readOnly"]) == ("teams/a", True)


@pytest.mark.parametrize("options, message", [
    (K8sOptions(), "an image is required"),
    (K8sOptions(image="Not An Image"), "not an image reference"),
    (K8sOptions(image=IMAGE, model_uri="/data/models"), "not a location a pod can read"),
    (K8sOptions(image=IMAGE, model_uri="as://acct/c/m", kserve=True), "KServe's storage initializer"),
    (K8sOptions(image=IMAGE, name="Latte_Server"), "must be a DNS label"),
    (K8sOptions(image=IMAGE, memory="4 GB"), "not a Kubernetes quantity"),
    (K8sOptions(image=IMAGE, min_replicas=3, max_replicas=2), "must be >= --min-replicas"),
    (K8sOptions(image=IMAGE, target_queue_us=50), "not above the longest dynamic-batching delay"),
    (K8sOptions(image=IMAGE, storage_secret="creds"), "pvc:// volume needs no credentials"),
    (K8sOptions(image=IMAGE, kserve=True, model_uri="s3://b/m", storage_secret="creds"), "from the ServiceAccount"),
    (K8sOptions(image=IMAGE, gpu_resource="gpu"), "not an extended resource name"),
    (K8sOptions(image=IMAGE, scale_metric="cpu"), "expected one of queue-time, pending"),
])
def test_bad_options_name_what_is_wrong(tmp_path, options, message):
    repo = tmp_path / "repo"
    latte_model(repo, "m", delay_us=100)
    with pytest.raises(DeployError, match=message):
        render_k8s(repo, tmp_path / "out", options)


def test_a_repository_without_models_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DeployError, match="holds no models"):
        render_k8s(tmp_path / "empty", tmp_path / "out", K8sOptions(image=IMAGE))
    with pytest.raises(DeployError, match="is not a folder"):
        render_k8s(tmp_path / "missing", tmp_path / "out", K8sOptions(image=IMAGE))
    (tmp_path / "stray" / "model").mkdir(parents=True)
    with pytest.raises(DeployError, match="has no config.pbtxt"):
        render_k8s(tmp_path / "stray", tmp_path / "out", K8sOptions(image=IMAGE))


# --- the image ----------------------------------------------------------------------------------------------


def test_dockerfile_installs_latte_and_the_runtimes_the_models_use(tmp_path):
    repo = tmp_path / "repo"
    latte_model(repo, "only_onnx", runtime="onnx")
    render_k8s(repo, tmp_path / "out", K8sOptions(image=IMAGE, triton_image="nvcr.io/nvidia/tritonserver:24.08-py3"))
    dockerfile = (tmp_path / "out" / "image" / "Dockerfile").read_text()
    assert "ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.08-py3" in dockerfile
    assert 'ARG RUNTIME_PACKAGES="onnxruntime"' in dockerfile
    assert "latte install-backend /opt/tritonserver/backends --tritonserver /opt/tritonserver" in dockerfile
    assert '"numpy<2"' in dockerfile

    other = tmp_path / "other"
    write_model(other, {"name": "plain_python", "backend": "python", "max_batch_size": 0,
                        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}, files={})
    render_k8s(other, tmp_path / "other-out", K8sOptions(image=IMAGE))
    assert 'ARG RUNTIME_PACKAGES=""' in (tmp_path / "other-out" / "image" / "Dockerfile").read_text()


def test_deploy_dockerfile_in_the_source_tree_is_the_rendered_default():
    checked_in = SOURCE_TREE / "deploy" / "Dockerfile"
    if not checked_in.exists():
        pytest.skip("runs from a source checkout")
    assert checked_in.read_text() == render_dockerfile(), "re-render deploy/Dockerfile with render_dockerfile()"


def test_dockerfile_copies_every_folder_the_wheel_is_assembled_from():
    """Stage 1 must see every source folder pyproject.toml packs into the wheel, and nothing missing."""
    tomllib = pytest.importorskip("tomllib")
    if not (SOURCE_TREE / "pyproject.toml").exists():
        pytest.skip("runs from a source checkout")
    copied = set()
    for line in render_dockerfile().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(line.split()[1:-1])
    pyproject = tomllib.loads((SOURCE_TREE / "pyproject.toml").read_text())
    packed = pyproject["tool"]["scikit-build"]["wheel"]["packages"].values()
    top_level = {path.split("/")[0] for path in packed}
    assert top_level <= copied, f"Dockerfile misses {sorted(top_level - copied)}"
    assert {"pyproject.toml", "CMakeLists.txt", "README.md", "csrc"} <= copied
    assert all((SOURCE_TREE / path).exists() for path in copied)


# --- sizing -------------------------------------------------------------------------------------------------


def test_replicas_for_a_target_rate():
    assert replicas_for_rate(2000, {"throughput_rps": 450, "p99_ms": 18}) == 5
    assert replicas_for_rate(2000, {"throughput_rps": 450}, headroom=0.2) == 6
    assert replicas_for_rate(300, {"throughput_rps": 100}) == 3
    assert replicas_for_rate(1, {"throughput_rps": 100}) == 1


def test_sizing_refuses_profiles_it_cannot_use():
    with pytest.raises(DeployError, match="over the 20 ms budget"):
        replicas_for_rate(1000, {"throughput_rps": 400, "p99_ms": 35}, p99_budget_ms=20)
    with pytest.raises(DeployError, match="needs 'throughput_rps'"):
        replicas_for_rate(1000, {"p99_ms": 10})
    with pytest.raises(DeployError, match="must be a positive number"):
        replicas_for_rate(1000, {"throughput_rps": 0})
    with pytest.raises(DeployError, match="headroom"):
        replicas_for_rate(1000, {"throughput_rps": 10}, headroom=-0.5)


# --- the command line ---------------------------------------------------------------------------------------


def test_cli_sizes_the_fleet_from_a_target_rate(examples_repo, tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"throughput_rps": 450, "p99_ms": 18}))
    code = main(["deploy", "k8s", str(examples_repo), "-o", str(tmp_path / "out"), "--image", IMAGE,
                 "--target-rps", "2000", "--profile", str(profile), "--p99-budget-ms", "25", "--headroom", "0.2"])
    assert code == 0
    assert "validated 5 manifest(s)" in capsys.readouterr().out
    hpa = by_kind(tmp_path / "out")["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (6, 12)


def test_cli_explains_a_missing_image(examples_repo, tmp_path, capsys):
    assert main(["deploy", "k8s", str(examples_repo), "-o", str(tmp_path / "out")]) == 1
    assert "an image is required: pass --image" in capsys.readouterr().err
    assert main(["deploy", "k8s", str(examples_repo), "-o", str(tmp_path / "out"), "--image", IMAGE,
                 "--target-rps", "100"]) == 1
    assert "--replica-throughput RPS or --profile FILE" in capsys.readouterr().err


def test_cli_validates_edited_manifests(examples_repo, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["deploy", "k8s", str(examples_repo), "-o", str(out), "--image", IMAGE]) == 0
    assert main(["deploy", "validate", str(out), "--kubernetes-version", "1.37.0"]) == 0
    assert "5 object(s) in 5 file(s) are valid" in capsys.readouterr().out
    edited = (out / "hpa.yaml").read_text().replace("maxReplicas:", "maxReplica:")
    (out / "hpa.yaml").write_text(edited)
    assert main(["deploy", "validate", str(out / "hpa.yaml")]) == 1
    assert "HorizontalPodAutoscaler/latte" in capsys.readouterr().err


# --- secure by default ---------------------------------------------------------------------------------------


def pod_and_container(out: Path, kserve: bool):
    """The pod spec and the Triton container of either rendering."""
    if kserve:
        (isvc,) = load_manifests(out / "inferenceservice.yaml")
        predictor = isvc["spec"]["predictor"]
        return predictor, predictor["model"]
    deployment = by_kind(out)["Deployment"]
    return deployment["spec"]["template"]["spec"], container_of(deployment)


@pytest.mark.parametrize("kserve", [False, True], ids=["deployment", "kserve"])
def test_the_pods_run_least_privileged_with_the_admin_apis_behind_the_secrets_header(examples_repo, tmp_path, kserve):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kserve=kserve, model_uri="s3://models/latte"))
    pod, container = pod_and_container(tmp_path, kserve)
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    # Writable only where tritonserver, the stubs and the runtimes write.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm" and mounts["tmp"] == "/tmp"
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HOME"]["value"] == "/tmp"
    # The header's value comes from a Secret, never from the manifest.
    assert env["LATTE_ADMIN_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "latte-admin", "key": "token"}}
    if kserve:  # KServe's runtime starts tritonserver itself
        apis = "shared-memory,model-repository,logging,trace"
        assert f"--http-restricted-api={apis}:latte-admin-key=$(LATTE_ADMIN_TOKEN)" in container["args"]
        assert f"--grpc-restricted-protocol={apis}:latte-admin-key=$(LATTE_ADMIN_TOKEN)" in container["args"]
    else:  # latte serve restricts the same APIs with the token it is given
        own, triton = serve_and_triton_args(container)
        assert "--access-token=$(LATTE_ADMIN_TOKEN)" in own and "--open-admin-apis" not in own
        assert not any("restricted" in a for a in triton)
    readme = (tmp_path / "README.md").read_text()
    assert "kubectl create secret generic latte-admin --from-literal=token=$(openssl rand -hex 24)" in readme


@pytest.mark.parametrize("kserve", [False, True], ids=["deployment", "kserve"])
def test_a_network_policy_lets_in_labelled_clients_and_the_monitoring_namespace(examples_repo, tmp_path, kserve):
    render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, kserve=kserve, model_uri="s3://models/latte"))
    policy = by_kind(tmp_path)["NetworkPolicy"]["spec"]
    selected = policy["podSelector"]["matchLabels"]
    if kserve:
        assert selected == {"serving.kserve.io/inferenceservice": "latte"}
    else:  # the Service's selector: a canary's pods too
        assert selected == by_kind(tmp_path)["Service"]["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    clients, *rest, metrics = policy["ingress"]
    assert clients["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"latte.dev/client": "true"}}}]
    if not kserve:
        assert [p["port"] for p in clients["ports"]] == [8000, 8001]
    # The health port too, where the supervisor's /metrics are (KServe's pods have no supervisor).
    scraped = [8002] if kserve else [8002, 8003]
    assert metrics == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                       "ports": [{"port": port, "protocol": "TCP"} for port in scraped]}
    # KServe's requests arrive through its data plane.
    planes = [f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for r in rest for f in r["from"]]
    assert planes == (["knative-serving", "istio-system"] if kserve else [])


def test_each_relaxation_is_a_named_flag(examples_repo, tmp_path, capsys):
    out = tmp_path / "relaxed"
    assert main(["deploy", "k8s", str(examples_repo), "-o", str(out), "--image", IMAGE, "--run-as-user", "2000",
                 "--writable-root-filesystem", "--open-admin-apis", "--no-network-policy"]) == 0
    pod, container = pod_and_container(out, kserve=False)
    assert pod["securityContext"]["runAsUser"] == 2000
    assert container["securityContext"]["readOnlyRootFilesystem"] is False
    assert not any("restricted" in a or "--access-token" in a for a in container["args"])
    assert "--open-admin-apis" in serve_and_triton_args(container)[0]
    assert "LATTE_ADMIN_TOKEN" not in {e["name"] for e in container["env"]}
    assert not (out / "networkpolicy.yaml").exists()
    named = tmp_path / "named"
    assert main(["deploy", "k8s", str(examples_repo), "-o", str(named), "--image", IMAGE, "--admin-secret", "ops-key",
                 "--client-label", "team=search", "--monitoring-namespace", "observability"]) == 0
    _, container = pod_and_container(named, kserve=False)
    assert {e["name"]: e for e in container["env"]}["LATTE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "ops-key"
    policy = by_kind(named)["NetworkPolicy"]["spec"]
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {"team": "search"}
    assert policy["ingress"][-1]["from"][0]["namespaceSelector"]["matchLabels"] == \
        {"kubernetes.io/metadata.name": "observability"}


@pytest.mark.parametrize("options, message", [
    ({"run_as_user": 0}, "--run-as-user must be a user id >= 1 (0 is root"),
    ({"client_label": "no-value"}, "--client-label 'no-value' must be KEY=VALUE"),
    ({"admin_secret": "Not_A_Name"}, "--admin-secret 'Not_A_Name' must be a Secret name"),
    ({"monitoring_namespace": "Mon"}, "--monitoring-namespace 'Mon' must be a namespace name"),
])
def test_a_relaxation_given_wrongly_is_refused(examples_repo, tmp_path, options, message):
    with pytest.raises(DeployError, match=re.escape(message)):
        render_k8s(examples_repo, tmp_path, K8sOptions(image=IMAGE, **options))
