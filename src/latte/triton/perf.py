"""Driving NVIDIA's perf_analyzer (shipped in the tritonclient 2.51 wheel) and reading its CSV."""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from latte.triton.locate import pytriton_root


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is missing, could not start, or failed the measurement."""


@dataclass
class PerfPoint:
    concurrency: Optional[int]
    request_rate: Optional[float]
    throughput: float       # inferences per second
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    queue_us: float         # server-side queue time per request
    compute_us: float       # server-side input + infer + output per request

    def as_dict(self) -> dict:
        return asdict(self)


def find_perf_analyzer() -> Path:
    candidate = Path(sys.executable).parent / "perf_analyzer"
    if candidate.exists():
        return candidate
    found = shutil.which("perf_analyzer")
    if found:
        return Path(found)
    raise PerfAnalyzerError("perf_analyzer not found: install tritonclient[all]==2.51.0 (its wheel carries it)")


def _runtime_libs() -> Optional[Path]:
    """A folder of the two libraries perf_analyzer links but pip does not provide by name.

    libb64.so.0d and libcudart.so.12 both ship inside the nvidia-pytriton wheel (under
    auditwheel's mangled names); links with the expected names avoid an apt install.
    """
    root = pytriton_root()
    if root is None:
        return None
    libs = root.parent / "nvidia_pytriton.libs"
    folder = Path(sys.prefix) / "share" / "latte" / "perf-libs"
    folder.mkdir(parents=True, exist_ok=True)
    for pattern, name in (("libb64-*.so.0d", "libb64.so.0d"), ("libcudart-*.so.12*", "libcudart.so.12")):
        matches = sorted(glob.glob(str(libs / pattern)))
        link = folder / name
        if matches and not link.exists():
            tmp = folder / (name + ".tmp")
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(matches[0])
            tmp.replace(link)
    return folder


def install_perf_analyzer_wrapper() -> Optional[Path]:
    """Make <venv>/bin/perf_analyzer run as typed: the tritonclient wheel's binary moves to
    <venv>/libexec/latte/ and a small script in its place puts its two libraries on the
    loader's path. Returns the script, or None where there is no binary or no libraries."""
    binary = Path(sys.executable).parent / "perf_analyzer"
    real = Path(sys.prefix) / "libexec" / "latte" / "perf_analyzer"
    libs = _runtime_libs()
    if libs is None or not binary.exists():
        return None
    with open(binary, "rb") as f:
        is_elf = f.read(4) == b"\x7fELF"
    if is_elf:  # a fresh (or re-installed) tritonclient
        real.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(binary), str(real))
    elif not real.exists():
        return binary  # a script that is not ours: leave it
    binary.write_text(
        "#!/bin/sh\n"
        "# Written by `latte install-backend`: perf_analyzer from the tritonclient wheel, with the\n"
        "# libb64 and libcudart it links (bundled by nvidia-pytriton) on the loader's path.\n"
        f'LD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{real}" "$@"\n')
    binary.chmod(0o755)
    return binary


def perf_analyzer_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    libs = _runtime_libs()
    if libs is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libs)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    return env


def _bytes_entry(array: np.ndarray) -> dict:
    """A BYTES tensor as perf_analyzer's input data holds it: text as content, other bytes as the
    tensor's wire form (each element a 4-byte little-endian length, then its bytes) in base64."""
    elements = [bytes(v) for v in array.reshape(-1)]
    try:
        return {"content": [v.decode("utf-8") for v in elements], "shape": list(array.shape)}
    except UnicodeDecodeError:
        import base64
        import struct

        wire = b"".join(struct.pack("<I", len(v)) + v for v in elements)
        return {"b64": base64.b64encode(wire).decode(), "shape": list(array.shape)}


def write_input_data(path: Path, samples: Iterable[Mapping[str, np.ndarray]]) -> Path:
    """perf_analyzer's --input-data JSON; each sample is one request (no batch dimension)."""
    data = []
    for sample in samples:
        entry = {}
        for name, array in sample.items():
            array = np.asarray(array)
            if array.dtype.kind == "O":
                entry[name] = _bytes_entry(array)
            else:
                entry[name] = {"content": array.reshape(-1).tolist(), "shape": list(array.shape)}
        data.append(entry)
    if not data:
        raise ValueError("write_input_data needs at least one sample")
    Path(path).write_text(json.dumps({"data": data}))
    return Path(path)


def _float(row: Mapping[str, str], key: str) -> float:
    value = row.get(key)
    return float(value) if value not in (None, "") else 0.0


def _average_ms(row: Mapping[str, str]) -> float:
    """Average latency; perf_analyzer 2.51 has no "Avg latency" column, only its parts (us)."""
    if row.get("Avg latency"):
        return _float(row, "Avg latency") / 1000.0
    parts = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
             "Server Compute Infer", "Server Compute Output", "Client Recv")
    return sum(_float(row, key) for key in parts) / 1000.0


def parse_csv(path: Path) -> List[PerfPoint]:
    points = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            concurrency = row.get("Concurrency")
            rate = row.get("Request Rate")
            points.append(PerfPoint(
                concurrency=int(float(concurrency)) if concurrency else None,
                request_rate=float(rate) if rate else None,
                throughput=_float(row, "Inferences/Second"),
                p50_ms=_float(row, "p50 latency") / 1000.0,
                p90_ms=_float(row, "p90 latency") / 1000.0,
                p95_ms=_float(row, "p95 latency") / 1000.0,
                p99_ms=_float(row, "p99 latency") / 1000.0,
                avg_ms=_average_ms(row),
                queue_us=_float(row, "Server Queue"),
                compute_us=_float(row, "Server Compute Input") + _float(row, "Server Compute Infer")
                + _float(row, "Server Compute Output"),
            ))
    return points


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: str = "grpc",
    concurrency: Optional[Sequence[int]] = None,
    request_rate: Optional[Sequence[float]] = None,
    input_data: Optional[Path] = None,
    shape: Optional[Mapping[str, Sequence[int]]] = None,
    measurement_ms: int = 2000,
    max_trials: int = 6,
    batch_size: int = 1,
    stability_percentage: float = 25.0,
    extra_args: Sequence[str] = (),
    timeout: float = 600.0,
) -> List[PerfPoint]:
    """Measure MODEL at each concurrency (or request rate) and return one point per level."""
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency or request_rate")
    if protocol not in ("grpc", "http"):
        raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
    with tempfile.TemporaryDirectory(prefix="latte-perf-") as tmp:
        report = Path(tmp) / "perf.csv"
        cmd = [str(find_perf_analyzer()), "-m", model, "-u", url, "-i", protocol, "-b", str(batch_size),
               "--measurement-interval", str(measurement_ms), "--max-trials", str(max_trials), "-f", str(report),
               # perf_analyzer's default (10 %) rarely settles on a shared 2-core machine.
               "--stability-percentage", str(stability_percentage)]
        if concurrency is not None:
            levels = sorted(set(int(c) for c in concurrency))
            cmd += ["--concurrency-range", f"{levels[0]}:{levels[-1]}:{_step(levels)}"]
        else:
            rates = sorted(set(float(r) for r in request_rate))
            cmd += ["--request-rate-range", f"{rates[0]}:{rates[-1]}:{_step(rates)}"]
        if input_data is not None:
            cmd += ["--input-data", str(input_data)]
        for name, dims in (shape or {}).items():
            cmd += ["--shape", f"{name}:{','.join(str(d) for d in dims)}"]
        cmd += list(extra_args)
        proc = subprocess.run(cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not report.exists():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise PerfAnalyzerError(f"perf_analyzer failed (exit {proc.returncode}) for model {model!r}:\n{tail}")
        return parse_csv(report)


def _step(levels: Sequence[float]):
    if len(levels) < 2:
        return 1
    steps = {round(b - a, 6) for a, b in zip(levels, levels[1:])}
    if len(steps) != 1:
        raise ValueError(f"perf_analyzer sweeps evenly spaced levels; got {list(levels)}")
    step = steps.pop()
    return int(step) if float(step).is_integer() else step


def read_input_data(path: Path) -> List[Dict[str, np.ndarray]]:
    """The requests of a perf_analyzer --input-data JSON (as write_input_data writes it): each
    input as an array of its shape; strings as bytes (content as UTF-8, b64 as the wire form)."""
    import base64
    import struct

    requests = []
    for entry in json.loads(Path(path).read_text())["data"]:
        request = {}
        for name, tensor in entry.items():
            if not isinstance(tensor, Mapping):
                tensor = {"content": tensor}
            shape = tensor.get("shape")
            if "b64" in tensor:
                wire, values, at = base64.b64decode(tensor["b64"]), [], 0
                while at < len(wire):
                    (size,) = struct.unpack_from("<I", wire, at)
                    values.append(wire[at + 4:at + 4 + size])
                    at += 4 + size
                array = np.array(values, dtype=object)
            else:
                content = tensor["content"]
                array = (np.array([v.encode() for v in content], dtype=object)
                         if content and isinstance(content[0], str) else np.asarray(content))
            request[name] = array.reshape(shape) if shape else array
        requests.append(request)
    return requests
