import subprocess
import sys
from pathlib import Path

import pytest

from latte.triton import TritonNotFound, find_triton, install_backend


def test_the_bundled_tritonserver_is_found_with_a_stub_for_this_python():
    install = find_triton()
    assert install.server.name == "tritonserver" and install.server.exists()
    assert (install.python_backend / "libtriton_python.so").exists()
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in str(install.stub)
    env = install.environment({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)  # the stub finds this venv


def test_install_backend_lays_out_python_and_latte(tmp_path):
    dest = install_backend(tmp_path / "backends", find_triton())
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"):
        assert (dest / "python" / name).is_file()
    assert "class TritonPythonModel" in (dest / "latte" / "model.py").read_text()


def test_an_explicit_triton_without_a_python_backend_is_a_clear_error(tmp_path):
    fake_root = tmp_path / "tritonserver"
    (fake_root / "bin").mkdir(parents=True)
    (fake_root / "bin" / "tritonserver").write_text("")
    with pytest.raises(TritonNotFound, match="no Python backend"):
        find_triton(str(fake_root))


def test_cli_help_lists_every_command_with_one_line():
    out = subprocess.run([sys.executable, "-m", "latte.cli", "--help"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    for command in ("install-backend", "serve", "examples", "demo", "tritonserver", "perf-analyzer", "bench"):
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(command + " "))
        assert len(lines[at].split(None, 1)) == 2, f"{command} has no help text"
        # One line each: the next line starts the next command, not a continuation.
        following = lines[at + 1] if at + 1 < len(lines) else ""
        assert following == "" or (following.startswith("    ") and not following.startswith("      ")), following
