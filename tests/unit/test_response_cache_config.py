"""A server on a repository whose models enable Triton's response cache is started with a cache."""

from __future__ import annotations

import pytest

from latte.generator.model_folder import write_model
from latte.triton import TritonServer
from latte.triton.cache import DEFAULT_CACHE_BYTES, cache_flag, models_with_response_cache


def python_model(repo, name: str, response_cache: bool):
    return write_model(repo, {
        "name": name, "backend": "python", "max_batch_size": 4,
        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "response_cache": response_cache,
    }, files={})


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    python_model(repo, "plain", False)
    python_model(repo, "repeated", True)
    return repo


def cache_args(server: TritonServer) -> list:
    return [a for a in server.command() if a.startswith("--cache-config")]


def test_the_rendered_config_carries_the_cache_switch(repo):
    assert "response_cache { enable: true }" in (repo / "repeated" / "config.pbtxt").read_text()
    assert "response_cache" not in (repo / "plain" / "config.pbtxt").read_text()
    assert models_with_response_cache(repo) == ["repeated"]


def test_a_model_asking_for_the_cache_gets_the_default_size(repo):
    assert cache_args(TritonServer(repo)) == [cache_flag(DEFAULT_CACHE_BYTES)]
    assert cache_args(TritonServer(repo, response_cache_bytes=1 << 20)) == ["--cache-config=local,size=1048576"]
    assert cache_args(TritonServer(repo, response_cache_bytes=0)) == []


def test_no_cache_when_no_model_asks_for_one(tmp_path):
    python_model(tmp_path / "repo", "plain", False)
    assert cache_args(TritonServer(tmp_path / "repo")) == []


def test_serve_refuses_a_bad_size_in_one_line(repo, capsys):
    from latte.cli import main

    assert main(["serve", str(repo), "--response-cache-size", "big"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("latte serve: error: cache size 'big': expected bytes, optionally with a unit "
                           "(Ki, Mi, Gi, K, M, G), e.g. 256Mi")
