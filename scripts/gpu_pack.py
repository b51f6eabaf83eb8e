#!/usr/bin/env python3
"""Pack the Triton server latte drives into one archive, for a GPU machine with no package registry.

The pinned wheels (nvidia-pytriton, tritonclient, numpy, python-rapidjson) weigh about 90 MB, most
of it stubs for other Pythons and libraries nothing loads. This keeps what tritonserver, its Python
backend, the target Python's stub and perf_analyzer load (the DT_NEEDED closure over the libraries
nvidia-pytriton bundles), strips the ELF files and writes one compressed tar:

    python3 scripts/gpu_pack.py [--python 3.12] [--out build/gpu-pack]
        fetches the pinned wheels into OUT/wheels/ where missing (and, for 3.12, Ubuntu 24.04's
        libpython3.12) and writes OUT/triton-py3.12.tar.xz; --python 3.11 packs for this
        machine's Python, to rehearse here.
    python3 scripts/gpu_pack.py --check ARCHIVE_OR_DIR
        prints `ok`, or the archive's problems one a line (exit 1).

Under triton/ in the archive: site/ goes on PYTHONPATH (pytriton/ there only marks where the server
lives, for src/latte/triton/locate.py; nvidia_pytriton.libs/ sits beside it as after a pip
install); bin/perf_analyzer goes into the venv's bin/ before `latte install-backend`, which wraps it;
lib/ (3.12 only) holds a libpython3.12.so.1.0 for a python3 built without a shared one;
MANIFEST.json names the file of each role.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator

PINS = {
    "nvidia-pytriton": "0.7.0",
    "tritonclient": "2.51.0",
    "numpy": "1.26.4",
    "python-rapidjson": "1.20",
}
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")

# Ubuntu 24.04's libpython, for a target python3 that has no shared libpython3.12 for the stub.
LIBPYTHON_PYTHON = "3.12"
LIBPYTHON_DEB_URL = (
    "http://archive.ubuntu.com/ubuntu/pool/main/p/python3.12/libpython3.12t64_3.12.3-1_amd64.deb")
LIBPYTHON_DEB_SIZE = 2_338_824
LIBPYTHON_DEB_SHA256 = "31df8af8521fb3fdf198d7507765d4ebf435c7165a50013b39d2761fd6c0d98c"
LIBPYTHON_MEMBER = "usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0"

REQUIRED_ROLES = (
    "tritonserver", "python_backend", "python_backend_utils", "stub", "libtritonserver",
    "numpy", "tritonclient", "perf_analyzer", "libb64", "libcudart",
)

REPO = Path(__file__).resolve().parent.parent
SERVER = "pytriton/tritonserver"
BUNDLED_LIBS = "nvidia_pytriton.libs"
PERF_ANALYZER = "tritonclient-{version}.data/data/bin/perf_analyzer"
TRITONCLIENT_PACKAGE = "tritonclient-{version}.data/purelib/tritonclient/"
PYTRITON_MARKER = (
    "# Only marks where the Triton server lives (tritonserver/) for latte's locator.\n")

# Measured on the 3.12 archive (171 MB of tar): xz -9 gives 36.1 MiB, zstd -19 --long 40.2 MiB and
# zstd --ultra -22 --long 39.3 MiB. xz is also what Python's tarfile unpacks with no tool installed.
COMPRESS = ("xz", "-9", "-T0", "-c")
SUFFIX = ".tar.xz"


class PackError(RuntimeError):
    """A download failed, a tool is missing, or a wheel lacks a file the archive needs."""


def required_roles(python: str | None) -> tuple[str, ...]:
    return REQUIRED_ROLES + (("libpython",) if python == LIBPYTHON_PYTHON else ())


def check_manifest(manifest: dict, root: Path) -> list[str]:
    """What is wrong with an unpacked archive: roles its manifest lacks, and files it names that
    are missing under ROOT (the folder holding MANIFEST.json). Empty when all is well."""
    problems = []
    python = manifest.get("python")
    if not python:
        problems.append("manifest: no python version")
    files = manifest.get("files", {})
    problems += [f"role {role}: missing from the manifest" for role in required_roles(python)
                 if role not in files]
    problems += [f"role {role}: {path} is missing under {root}" for role, path in sorted(files.items())
                 if not (root / path).exists()]
    return problems


# -- the DT_NEEDED closure ------------------------------------------------------------------------

def resolve_needed(needed: str, available: Collection[str]) -> str | None:
    """The file of AVAILABLE that a NEEDED entry loads: the same name, or auditwheel's renamed copy
    (a hash after the stem, maybe a longer version: libcudart.so.12 -> libcudart-09529672.so.12.6.77).
    None for a library the system provides (libc, libstdc++, libz, libpython)."""
    if needed in available:
        return needed
    stem, dot, rest = needed.partition(".")
    renamed = re.compile(re.escape(stem) + r"-[0-9a-f]{8}" + re.escape(dot + rest) + r"(\.[0-9]+)*")
    matches = sorted(name for name in available if renamed.fullmatch(name))
    return matches[0] if matches else None


def bundled_closure(needs: Iterable[str], available: Collection[str],
                    needed_of: Callable[[str], Iterable[str]]) -> list[str]:
    """The files of AVAILABLE that NEEDS load, directly or through one another; NEEDED_OF gives the
    NEEDED entries of one of those files."""
    kept: set[str] = set()
    pending = list(needs)
    while pending:
        name = resolve_needed(pending.pop(), available)
        if name is not None and name not in kept:
            kept.add(name)
            pending.extend(needed_of(name))
    return sorted(kept)


def needed_libraries(path: Path) -> list[str]:
    dynamic = run(["readelf", "-d", str(path)], env={**os.environ, "LC_ALL": "C"}).decode()
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)


# -- tools, downloads and wheels ------------------------------------------------------------------

def run(command: list[str], **kwargs) -> bytes:
    if shutil.which(command[0]) is None:
        raise PackError(f"{command[0]} is not installed")
    proc = subprocess.run(command, capture_output=True, **kwargs)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or ["(no message)"]
        raise PackError(f"{' '.join(command[:3])} ... failed: {lines[-1]}")
    return proc.stdout


def find_wheel(wheels: Path, dist: str, version: str, python: str) -> Path | None:
    """The pinned wheel of DIST in WHEELS that installs on PYTHON (py3, or built for cpXY)."""
    accepted = {"py3", "cp" + python.replace(".", "")}
    for wheel in sorted(wheels.glob(f"{dist.replace('-', '_')}-{version}-*.whl")):
        python_tags = wheel.stem.split("-")[-3].split(".")
        if accepted.intersection(python_tags):
            return wheel
    return None


def ensure_wheels(wheels: Path, python: str) -> dict[str, Path]:
    missing = [dist for dist, version in PINS.items() if find_wheel(wheels, dist, version, python) is None]
    if missing:
        wheels.mkdir(parents=True, exist_ok=True)
        platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", python, "--implementation", "cp", *platforms, "-d", str(wheels),
             *(f"{dist}=={PINS[dist]}" for dist in missing)])
    found = {dist: find_wheel(wheels, dist, version, python) for dist, version in PINS.items()}
    absent = [f"{dist}=={PINS[dist]}" for dist, wheel in found.items() if wheel is None]
    if absent:
        raise PackError(f"no wheel for Python {python} in {wheels}: {', '.join(absent)}")
    return found


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_libpython_deb(wheels: Path) -> Path:
    deb = wheels / LIBPYTHON_DEB_URL.rsplit("/", 1)[1]
    if deb.exists() and sha256(deb) == LIBPYTHON_DEB_SHA256:
        return deb
    wheels.mkdir(parents=True, exist_ok=True)
    partial = deb.with_name(deb.name + ".part")
    try:
        with urllib.request.urlopen(LIBPYTHON_DEB_URL, timeout=60) as answer, open(partial, "wb") as f:
            shutil.copyfileobj(answer, f)
    except OSError as error:
        raise PackError(f"download of {LIBPYTHON_DEB_URL} failed: {error}") from None
    size, digest = partial.stat().st_size, sha256(partial)
    if (size, digest) != (LIBPYTHON_DEB_SIZE, LIBPYTHON_DEB_SHA256):
        partial.unlink()
        raise PackError(f"{deb.name}: got {size} bytes with sha256 {digest}, "
                        f"expected {LIBPYTHON_DEB_SIZE} bytes with sha256 {LIBPYTHON_DEB_SHA256}")
    partial.replace(deb)
    return deb


# -- reading a .deb -------------------------------------------------------------------------------

def ar_members(blob: bytes) -> Iterator[tuple[str, bytes]]:
    """(name, content) of each member of an ar archive, the container of a .deb."""
    if not blob.startswith(b"!<arch>\n"):
        raise PackError("not an ar archive")
    at = 8
    while at + 60 <= len(blob):
        header = blob[at:at + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, blob[at + 60:at + 60 + size]
        at += 60 + size + size % 2  # members start at even offsets


def decompress(name: str, payload: bytes) -> bytes:
    if name.endswith(".zst"):
        return run(["zstd", "-dc"], input=payload)
    if name.endswith(".xz"):
        return lzma.decompress(payload)
    if name.endswith(".gz"):
        return gzip.decompress(payload)
    return payload


def deb_data_tar(deb: Path) -> bytes:
    """The uncompressed data.tar of DEB, through dpkg-deb where installed."""
    if shutil.which("dpkg-deb"):
        return run(["dpkg-deb", "--fsys-tarfile", str(deb)])
    for name, payload in ar_members(deb.read_bytes()):
        if name.startswith("data.tar"):
            return decompress(name, payload)
    raise PackError(f"{deb.name} has no data.tar")


def extract_from_deb(deb: Path, member: str, dest: Path) -> None:
    """Write DEB's file MEMBER to DEST, following symbolic links inside the package."""
    with tarfile.open(fileobj=io.BytesIO(deb_data_tar(deb))) as data:
        entries = {info.name.removeprefix("./"): info for info in data.getmembers()}
        for _ in range(8):
            info = entries.get(member)
            if info is None:
                raise PackError(f"{deb.name} has no {member}")
            if not info.issym():
                break
            member = posixpath.normpath(posixpath.join(posixpath.dirname(member), info.linkname))
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data.extractfile(info).read())
        dest.chmod(0o644)


# -- copying out of wheels ------------------------------------------------------------------------

def is_clutter(name: str) -> bool:
    parts = name.split("/")
    return "__pycache__" in parts or name.endswith(".pyc") or (parts[0] == "numpy" and "tests" in parts)


def write_member(wheel: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with wheel.open(info) as source, open(dest, "wb") as target:
        shutil.copyfileobj(source, target)
    # Wheels carry modes such as 0o777 and 0o666; only whether a file is executable matters.
    dest.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def copy_file(wheel: zipfile.ZipFile, name: str, dest: Path) -> Path:
    try:
        info = wheel.getinfo(name)
    except KeyError:
        raise PackError(f"{Path(wheel.filename).name} has no {name}") from None
    write_member(wheel, info, dest)
    return dest


def copy_tree(wheel: zipfile.ZipFile, folder: str, dest: Path) -> Path:
    """Copy the files under FOLDER/ of the wheel into DEST, leaving out caches and numpy's tests."""
    members = [info for info in wheel.infolist()
               if info.filename.startswith(folder) and not info.is_dir() and not is_clutter(info.filename)]
    if not members:
        raise PackError(f"{Path(wheel.filename).name} has no {folder}")
    for info in members:
        write_member(wheel, info, dest / info.filename[len(folder):])
    return dest


def dist_info(dist: str, version: str) -> str:
    return f"{dist.replace('-', '_')}-{version}.dist-info/"


# -- staging the archive's tree -------------------------------------------------------------------

def stage_pytriton(wheel: zipfile.ZipFile, root: Path, python: str) -> dict[str, Path]:
    site = root / "site"
    (site / "pytriton").mkdir(parents=True, exist_ok=True)
    (site / "pytriton" / "__init__.py").write_text(PYTRITON_MARKER)
    metadata = dist_info("nvidia-pytriton", PINS["nvidia-pytriton"])
    copy_tree(wheel, metadata, site / metadata)
    # All bundled libraries for now; prune_libraries keeps those the closure reaches.
    copy_tree(wheel, BUNDLED_LIBS + "/", site / BUNDLED_LIBS)
    backend = f"{SERVER}/backends/python"
    stub = f"{SERVER}/python_backend_stubs/{python}/triton_python_backend_stub"
    server = f"{SERVER}/bin/tritonserver"
    library = f"{backend}/libtriton_python.so"
    utils = f"{backend}/triton_python_backend_utils.py"
    return {
        "tritonserver": copy_file(wheel, server, site / server),
        "python_backend": copy_file(wheel, library, site / library),
        "python_backend_utils": copy_file(wheel, utils, site / utils),
        "stub": copy_file(wheel, stub, site / stub),
    }


def stage_tritonclient(wheel: zipfile.ZipFile, root: Path) -> dict[str, Path]:
    version = PINS["tritonclient"]
    metadata = dist_info("tritonclient", version)
    copy_tree(wheel, metadata, root / "site" / metadata)
    package = TRITONCLIENT_PACKAGE.format(version=version)
    perf_analyzer = PERF_ANALYZER.format(version=version)
    return {
        "tritonclient": copy_tree(wheel, package, root / "site" / "tritonclient"),
        "perf_analyzer": copy_file(wheel, perf_analyzer, root / "bin" / "perf_analyzer"),
    }


def stage_numpy(wheel: zipfile.ZipFile, root: Path) -> dict[str, Path]:
    site = root / "site"
    metadata = dist_info("numpy", PINS["numpy"])
    copy_tree(wheel, metadata, site / metadata)
    copy_tree(wheel, "numpy.libs/", site / "numpy.libs")
    return {"numpy": copy_tree(wheel, "numpy/", site / "numpy")}


def stage_rapidjson(wheel: zipfile.ZipFile, root: Path) -> dict[str, Path]:
    site = root / "site"
    metadata = dist_info("python-rapidjson", PINS["python-rapidjson"])
    copy_tree(wheel, metadata, site / metadata)
    modules = [name for name in wheel.namelist() if re.fullmatch(r"rapidjson\.[^/]*\.so", name)]
    if not modules:
        raise PackError(f"{Path(wheel.filename).name} has no rapidjson extension module")
    return {"rapidjson": copy_file(wheel, modules[0], site / modules[0])}


def prune_libraries(folder: Path, binaries: Iterable[Path]) -> tuple[list[str], list[str]]:
    """Delete the bundled libraries that BINARIES do not load; (kept, dropped) file names."""
    available = sorted(path.name for path in folder.iterdir())
    needs = [name for binary in binaries for name in needed_libraries(binary)]
    kept = bundled_closure(needs, available, lambda name: needed_libraries(folder / name))
    dropped = [name for name in available if name not in kept]
    for name in dropped:
        (folder / name).unlink()
    return kept, dropped


def bundled_role(folder: Path, needed: str) -> Path:
    name = resolve_needed(needed, [path.name for path in folder.iterdir()])
    if name is None:
        raise PackError(f"{folder.name} has no {needed}")
    return folder / name


def is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def strip_elf_files(root: Path) -> list[str]:
    """Strip every ELF file under ROOT; the files strip refused, with its message, stay as they were."""
    refused = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)):
        try:
            run(["strip", "--strip-unneeded", str(path)])
        except PackError as error:
            refused.append(f"{path.relative_to(root)}: {error}")
    return refused


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def stage(python: str, wheels: dict[str, Path], libpython_deb: Path | None, root: Path) -> dict:
    """Lay out the archive's tree under ROOT (its triton/ folder) and write MANIFEST.json."""
    roles: dict[str, Path] = {}
    with zipfile.ZipFile(wheels["nvidia-pytriton"]) as wheel:
        roles.update(stage_pytriton(wheel, root, python))
    with zipfile.ZipFile(wheels["tritonclient"]) as wheel:
        roles.update(stage_tritonclient(wheel, root))
    with zipfile.ZipFile(wheels["numpy"]) as wheel:
        roles.update(stage_numpy(wheel, root))
    with zipfile.ZipFile(wheels["python-rapidjson"]) as wheel:
        roles.update(stage_rapidjson(wheel, root))
    libs = root / "site" / BUNDLED_LIBS
    binaries = [roles[role] for role in ("tritonserver", "python_backend", "stub", "perf_analyzer")]
    kept, dropped = prune_libraries(libs, binaries)
    # perf_analyzer asks for these by their plain names; latte links them at run time.
    roles["libb64"] = bundled_role(libs, "libb64.so.0d")
    roles["libcudart"] = bundled_role(libs, "libcudart.so.12")
    roles["libtritonserver"] = bundled_role(libs, "libtritonserver.so")
    if libpython_deb is not None:
        roles["libpython"] = root / "lib" / Path(LIBPYTHON_MEMBER).name
        extract_from_deb(libpython_deb, LIBPYTHON_MEMBER, roles["libpython"])
    refused = strip_elf_files(root)
    manifest = {
        "python": python,
        "pins": PINS,
        "files": {role: path.relative_to(root).as_posix() for role, path in sorted(roles.items())},
        "sizes": {role: tree_size(path) for role, path in sorted(roles.items())},
        "libraries": kept,
    }
    (root / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return {"manifest": manifest, "dropped": dropped, "strip_refused": refused}


def write_archive(root: Path, archive: Path) -> None:
    tar = root.parent / "triton.tar"

    def anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as out:
        out.add(root, arcname=root.name, filter=anonymous)
    partial = archive.with_name(archive.name + ".part")
    with open(partial, "wb") as f:
        proc = subprocess.run([*COMPRESS, str(tar)], stdout=f, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        partial.unlink()
        raise PackError(f"{COMPRESS[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    partial.replace(archive)
    tar.unlink()


def pack(python: str, out: Path) -> Path:
    started = time.monotonic()
    wheels = ensure_wheels(out / "wheels", python)
    deb = ensure_libpython_deb(out / "wheels") if python == LIBPYTHON_PYTHON else None
    if shutil.which(COMPRESS[0]) is None:
        raise PackError(f"{COMPRESS[0]} is not installed")
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"triton-py{python}{SUFFIX}"
    with tempfile.TemporaryDirectory(prefix="stage-", dir=out) as scratch:
        root = Path(scratch) / "triton"
        staged = stage(python, wheels, deb, root)
        write_archive(root, archive)
    manifest = staged["manifest"]
    for role, path in manifest["files"].items():
        print(f"{role:22} {manifest['sizes'][role] / 2**20:8.2f} MiB  {path}")
    dropped = ", ".join(staged["dropped"]) or "none"
    print(f"{'libraries kept':22} {len(manifest['libraries']):8d}      dropped: {dropped}")
    for line in staged["strip_refused"]:
        print(f"not stripped: {line}")
    print(f"{'archive':22} {archive.stat().st_size / 2**20:8.2f} MiB  {archive} "
          f"({time.monotonic() - started:.0f} s)")
    return archive


# -- checking an archive --------------------------------------------------------------------------

def manifest_root(path: Path) -> Path:
    for candidate in (path, path / "triton"):
        if (candidate / "MANIFEST.json").is_file():
            return candidate
    raise PackError(f"no MANIFEST.json in {path} or {path / 'triton'}")


def unpack(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:
                tar.extractall(dest)
    except (tarfile.TarError, OSError) as error:
        raise PackError(f"cannot unpack {archive}: {error}") from None


def archive_problems(path: Path) -> list[str]:
    """check_manifest for an archive or for a folder it was unpacked into."""
    if path.is_dir():
        root = manifest_root(path)
        return check_manifest(json.loads((root / "MANIFEST.json").read_text()), root)
    if not path.is_file():
        raise PackError(f"{path} does not exist")
    with tempfile.TemporaryDirectory(prefix="gpu-pack-check-") as scratch:
        unpack(path, Path(scratch))
        return archive_problems(Path(scratch))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=LIBPYTHON_PYTHON,
                        help="X.Y of the target's python3 (default %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-pack",
                        help="folder for wheels/ and the archive (default build/gpu-pack)")
    parser.add_argument("--check", type=Path, metavar="ARCHIVE_OR_DIR",
                        help="check an archive, or the folder it was unpacked into, against its manifest")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.[0-9]+", args.python):
        parser.error(f"--python wants X.Y such as 3.12, got {args.python!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.check is not None:
            problems = archive_problems(args.check)
            print("\n".join(problems) if problems else "ok")
            return 1 if problems else 0
        pack(args.python, args.out)
    except PackError as error:
        print(f"gpu_pack: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
