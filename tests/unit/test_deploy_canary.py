"""`latte deploy k8s --canary-percent` and the response cache flag in the rendered pods."""

from __future__ import annotations

import pytest

from latte.cli import main
from latte.deploy import DeployError, K8sOptions, render_k8s
from latte.deploy.sizing import canary_replicas
from latte.deploy.validation import load_manifests
from latte.generator.model_folder import write_model
from latte.triton.cache import DEFAULT_CACHE_BYTES, CacheSizeError, cache_flag, parse_size

IMAGE = "registry.example.com/ml/latte-triton:0.1.0"
CANARY_IMAGE = "registry.example.com/ml/latte-triton:0.2.0"


def only(path):
    (doc,) = load_manifests(path)
    return doc


def container_args(deployment: dict) -> list:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


@pytest.fixture
def cached_repo(tmp_path):
    """One latte model whose config turns Triton's response cache on."""
    repo = tmp_path / "cached"
    write_model(repo, {
        "name": "ranker", "backend": "latte", "max_batch_size": 8,
        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"model_file": "model.onnx", "runtime": "onnx"},
        "response_cache": True,
    }, files={})
    return repo


def test_canary_deployment_shares_the_stable_service(example_repo, tmp_path):
    stable = render_k8s(example_repo, tmp_path / "stable", K8sOptions(image=IMAGE, min_replicas=4))
    canary = render_k8s(example_repo, tmp_path / "canary",
                        K8sOptions(image=CANARY_IMAGE, min_replicas=4, canary_percent=20,
                                   model_uri="pvc://latte-models/v2"))

    assert [p.name for p in canary.manifests] == ["canary.yaml"]
    assert not (tmp_path / "canary" / "hpa.yaml").exists()
    deployment = only(tmp_path / "canary" / "canary.yaml")
    assert deployment["metadata"]["name"] == "latte-canary"
    # 1 canary pod beside 4 stable ones: 20 % of the pods the Service spreads requests over.
    assert deployment["spec"]["replicas"] == 1 == canary.canary_replicas
    assert canary.canary_share == 20.0
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == CANARY_IMAGE
    service = only(stable.out_dir / "service.yaml")
    canary_pods = deployment["spec"]["template"]["metadata"]["labels"]
    stable_pods = only(stable.out_dir / "deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    # The stable Service reaches both; the stable HPA and PDB (by instance) only the stable pods.
    assert service["spec"]["selector"].items() <= canary_pods.items()
    assert service["spec"]["selector"].items() <= stable_pods.items()
    for kind in ("hpa.yaml", "pdb.yaml"):
        doc = only(stable.out_dir / kind)
        selector = doc["spec"].get("selector", {}).get("matchLabels") or \
            only(stable.out_dir / "deployment.yaml")["spec"]["selector"]["matchLabels"]
        assert not selector.items() <= canary_pods.items()
    assert not deployment["spec"]["selector"]["matchLabels"].items() <= stable_pods.items()
    readme = (tmp_path / "canary" / "README.md").read_text()
    assert "kubectl apply -f" in readme and "canary.yaml" in readme
    assert "kubectl delete deployment latte-canary" in readme


@pytest.mark.parametrize("stable, percent, expected", [(2, 10, 1), (4, 20, 1), (9, 10, 1), (18, 10, 2), (2, 50, 2),
                                                       (3, 75, 9)])
def test_canary_replicas_follow_the_percentage(stable, percent, expected):
    assert canary_replicas(stable, percent) == expected


def test_a_canary_render_replaces_nothing_but_itself(example_repo, tmp_path):
    out = tmp_path / "k8s"
    render_k8s(example_repo, out, K8sOptions(image=IMAGE, canary_percent=10))
    assert (out / "canary.yaml").exists()
    # Promoting: the stable render of the same folder drops the canary, so `kubectl apply -f OUT/` cannot revive it.
    render_k8s(example_repo, out, K8sOptions(image=CANARY_IMAGE))
    assert not (out / "canary.yaml").exists()
    assert (out / "deployment.yaml").exists()


def test_kserve_canary_traffic_percent(example_repo, tmp_path):
    result = render_k8s(example_repo, tmp_path / "kserve",
                        K8sOptions(image=CANARY_IMAGE, kserve=True, canary_percent=10,
                                   model_uri="s3://models/latte/v2"))
    service = only(result.manifests[0])
    assert service["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert "canaryTrafficPercent\":100" in (tmp_path / "kserve" / "README.md").read_text()


@pytest.mark.parametrize("kserve, percent, wording", [
    (False, 0, "from 1 to 99 (a split by replicas needs pods on both sides)"),
    (False, 100, "from 1 to 99"),
    (True, 101, "from 0 to 100, got 101"),
])
def test_canary_percent_out_of_range_is_refused(example_repo, tmp_path, kserve, percent, wording):
    with pytest.raises(DeployError, match=rf"--canary-percent must be a whole number {wording}".replace("(", r"\(")
                       .replace(")", r"\)")):
        render_k8s(example_repo, tmp_path / "k8s", K8sOptions(image=IMAGE, kserve=kserve, canary_percent=percent))


def test_cli_prints_the_canary_split(example_repo, tmp_path, capsys):
    assert main(["deploy", "k8s", str(example_repo), "-o", str(tmp_path / "c"), "--image", IMAGE,
                 "--canary-percent", "10"]) == 0
    assert "canary: 1 pod(s) beside at least 2 stable, 33.3 % of the pods (asked 10 %)" in capsys.readouterr().out


def test_a_model_with_response_cache_gives_the_pods_a_cache(cached_repo, example_repo, tmp_path):
    # latte serve's --response-cache-size, always stated: it turns into tritonserver's --cache-config.
    render_k8s(cached_repo, tmp_path / "on", K8sOptions(image=IMAGE))
    on = container_args(only(tmp_path / "on" / "deployment.yaml"))
    assert f"--response-cache-size={DEFAULT_CACHE_BYTES}" in on[:on.index("--")]
    render_k8s(example_repo, tmp_path / "off", K8sOptions(image=IMAGE))
    off = container_args(only(tmp_path / "off" / "deployment.yaml"))
    assert "--response-cache-size=0" in off[:off.index("--")]
    assert not any(a.startswith("--cache-config") for a in on + off)
    render_k8s(example_repo, tmp_path / "sized", K8sOptions(image=IMAGE, response_cache_bytes=parse_size("64Mi")))
    assert "--response-cache-size=67108864" in container_args(only(tmp_path / "sized" / "deployment.yaml"))
    kserve = render_k8s(cached_repo, tmp_path / "kserve", K8sOptions(image=IMAGE, kserve=True,
                                                                     model_uri="s3://models/cached"))
    assert only(kserve.manifests[0])["spec"]["predictor"]["model"]["args"][-1] == cache_flag(DEFAULT_CACHE_BYTES)


@pytest.mark.parametrize("text, size", [("268435456", 268435456), ("256Mi", 256 * 2 ** 20), ("1G", 10 ** 9),
                                        ("0", 0)])
def test_cache_sizes(text, size):
    assert parse_size(text) == size


def test_a_bad_cache_size_is_one_clear_line(example_repo, tmp_path, capsys):
    with pytest.raises(CacheSizeError):
        parse_size("lots")
    assert main(["deploy", "k8s", str(example_repo), "-o", str(tmp_path / "x"), "--image", IMAGE,
                 "--response-cache-size", "lots"]) != 0
    assert "cache size 'lots': expected bytes, optionally with a unit" in capsys.readouterr().err
