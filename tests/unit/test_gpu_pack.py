"""scripts/gpu_pack.py: the manifest check a GPU machine runs on the unpacked server, and the
DT_NEEDED closure that decides which of nvidia-pytriton's bundled libraries travel."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_gpu_pack():
    # scripts/ is not a package: load the script from its path, as `python3 scripts/gpu_pack.py` runs it.
    spec = importlib.util.spec_from_file_location("gpu_pack", REPO / "scripts" / "gpu_pack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_pack = load_gpu_pack()

# A few of the libraries nvidia-pytriton 0.7.0 bundles, under auditwheel's names, with their NEEDED.
BUNDLED = {
    "libtritonserver-717102f0.so": ["libcudart-09529672.so.12.6.77", "libxml2-4b4b5b24.so.2.9.13",
                                    "libz.so.1", "libstdc++.so.6", "libc.so.6"],
    "libxml2-4b4b5b24.so.2.9.13": ["libicuuc-4683f362.so.70.1", "libz.so.1", "libc.so.6"],
    "libicuuc-4683f362.so.70.1": ["libicudata-c1404396.so.70.1", "libc.so.6"],
    "libicudata-c1404396.so.70.1": [],
    "libcudart-09529672.so.12.6.77": ["libc.so.6", "libdl.so.2"],
    "libb64-98cb6333.so.0d": [],
    "libzstd-5df4f4df.so.1.4.8": ["libc.so.6"],
    "libpython3-419a3a08.13.so.1.0": ["libm.so.6", "libc.so.6"],
}


def unpacked_tree(root: Path, python: str = "3.11") -> dict:
    """A tree with a file for every role the archive of PYTHON has, and its manifest."""
    files = {role: f"files/{role}" for role in gpu_pack.required_roles(python)}
    for path in files.values():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    manifest = {"python": python, "pins": gpu_pack.PINS, "files": files, "sizes": {}}
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    return manifest


def test_a_tree_with_every_role_passes(tmp_path):
    manifest = unpacked_tree(tmp_path)
    assert gpu_pack.check_manifest(manifest, tmp_path) == []
    assert gpu_pack.main(["--check", str(tmp_path)]) == 0


def test_a_role_missing_from_the_manifest_is_named(tmp_path):
    manifest = unpacked_tree(tmp_path)
    del manifest["files"]["stub"]
    assert gpu_pack.check_manifest(manifest, tmp_path) == ["role stub: missing from the manifest"]


def test_libpython_is_required_only_of_the_python_it_is_packed_for(tmp_path):
    manifest = unpacked_tree(tmp_path, python="3.12")
    del manifest["files"]["libpython"]
    assert gpu_pack.check_manifest(manifest, tmp_path) == ["role libpython: missing from the manifest"]
    assert "libpython" not in gpu_pack.required_roles("3.11")


def test_a_missing_file_is_named_by_its_path(tmp_path, capsys):
    unpacked_tree(tmp_path)
    (tmp_path / "files" / "perf_analyzer").unlink()
    problems = gpu_pack.check_manifest(json.loads((tmp_path / "MANIFEST.json").read_text()), tmp_path)
    assert len(problems) == 1 and "files/perf_analyzer" in problems[0]
    assert gpu_pack.main(["--check", str(tmp_path)]) == 1
    assert "files/perf_analyzer" in capsys.readouterr().out


def test_plain_names_resolve_to_the_renamed_bundled_copies():
    assert gpu_pack.resolve_needed("libb64.so.0d", BUNDLED) == "libb64-98cb6333.so.0d"
    assert gpu_pack.resolve_needed("libcudart.so.12", BUNDLED) == "libcudart-09529672.so.12.6.77"
    # The system's libraries stay the system's: libz is not libzstd, 3.12 is not 3.13.
    assert gpu_pack.resolve_needed("libz.so.1", BUNDLED) is None
    assert gpu_pack.resolve_needed("libpython3.12.so.1.0", BUNDLED) is None


def test_the_closure_follows_needs_through_the_bundled_libraries():
    # perf_analyzer's needs (plain names) and tritonserver's (already the bundled names).
    needs = ["libb64.so.0d", "libcudart.so.12", "libz.so.1", "libtritonserver-717102f0.so"]
    kept = gpu_pack.bundled_closure(needs, BUNDLED, lambda name: BUNDLED[name])
    assert kept == ["libb64-98cb6333.so.0d", "libcudart-09529672.so.12.6.77", "libicudata-c1404396.so.70.1",
                    "libicuuc-4683f362.so.70.1", "libtritonserver-717102f0.so", "libxml2-4b4b5b24.so.2.9.13"]


def test_the_packed_archive_for_this_python_passes_its_check(tmp_path):
    archive = REPO / "build" / "gpu-pack" / "triton-py3.11.tar.xz"
    if not archive.exists():
        pytest.skip(f"no {archive.relative_to(REPO)}: `python3 scripts/gpu_pack.py --python 3.11` makes it")
    gpu_pack.unpack(archive, tmp_path)
    root = tmp_path / "triton"
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert set(gpu_pack.REQUIRED_ROLES) <= set(manifest["files"])
    assert gpu_pack.check_manifest(manifest, root) == []
