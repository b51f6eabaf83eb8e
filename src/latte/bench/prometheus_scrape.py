"""Prometheus text exposition parsing (prometheus_client's) and a background sampler of metrics
and process memory."""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

from latte.bench import procmem

# Series the reports keep: Triton's own (nv_*) and Latte's (latte_*), whatever exists.
KEPT_PREFIXES = ("nv_", "latte_")

# The keys' own notation, name{k="v",...}: series_key writes it, split_key reads it back.
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")


class MetricsFormatError(ValueError):
    """A line of the metrics text is not in Prometheus' text exposition format."""


def series_key(name: str, labels: Dict[str, str]) -> str:
    """One flat key per series, e.g. nv_inference_count{model="mlp_onnx",version="1"}."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_prometheus(text: str, prefixes: Tuple[str, ...] = KEPT_PREFIXES) -> Dict[str, float]:
    """Parse the text format into {series key: value}, keeping series whose name has a prefix.

    prometheus_client's parser reads the samples. The comment lines (HELP, TYPE) are left out
    first, so every series is read as written: typed, the library would name a counter's samples
    NAME_total as OpenMetrics does (Triton's nv_inference_count, latte's _bucket counters). It
    costs about 5x the regular expression this replaced (8.3 ms against 1.7 ms for a page of
    600 series), read every 0.5 s by a benchmark's sampler and every 5 s by the supervisor.
    """
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    values: Dict[str, float] = {}
    # Untyped, each sample line is a family of its own, so the families count the lines read.
    families = text_string_to_metric_families("\n".join(line for _, line in numbered))
    read = 0
    try:
        for read, family in enumerate(families, 1):
            for sample in family.samples:
                if not prefixes or sample.name.startswith(prefixes):
                    values[series_key(sample.name, sample.labels)] = float(sample.value)
    except ValueError as exc:
        number, line = numbered[read]
        raise MetricsFormatError(f"metrics line {number} is not 'name{{labels}} value' ({exc}): "
                                 f"{line.strip()[:120]!r}") from None
    return values


def scrape(url: str, timeout: float = 2.0) -> Dict[str, float]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse_prometheus(response.read().decode("utf-8", errors="replace"))


def split_key(key: str) -> Tuple[str, Dict[str, str]]:
    """series_key's name and labels again."""
    name, _, rest = key.partition("{")
    return name, {k: _UNESCAPE.sub(_unescape, v) if "\\" in v else v for k, v in _LABEL.findall(rest)}


def _unescape(match: "re.Match[str]") -> str:
    return "\n" if match[1] == "n" else match[1]


def total(values: Dict[str, float], name: str, **labels: str) -> Optional[float]:
    """Sum of every series called `name` whose labels include `labels`; None if there is none."""
    found = None
    for key, value in values.items():
        series, series_labels = split_key(key)
        if series == name and all(series_labels.get(k) == v for k, v in labels.items()):
            found = (found or 0.0) + value
    return found


@dataclass
class Sample:
    """One poll: seconds since the sampler started, metric values, RSS per process."""
    t: float
    metrics: Dict[str, float]
    rss: Dict[str, int] = field(default_factory=dict)

    @property
    def server_rss(self) -> int:
        return self.rss.get("tritonserver", 0)

    @property
    def stubs_rss(self) -> int:
        return sum(v for k, v in self.rss.items() if k.startswith("stub:"))

    def as_dict(self) -> dict:
        return {"t": round(self.t, 3), "metrics": self.metrics, "rss": self.rss}


class MetricsSampler:
    """Polls a metrics URL and the server's process memory in a background thread.

    >>> with MetricsSampler(server.metrics_url, server.process.pid) as sampler:
    ...     run_load()
    >>> sampler.samples()
    """

    def __init__(self, metrics_url: Optional[str], server_pid: Optional[int], interval: float = 0.5) -> None:
        if interval <= 0:
            raise ValueError(f"sampling interval must be > 0 s, got {interval}")
        self.metrics_url = metrics_url
        self.server_pid = server_pid
        self.interval = interval
        self.errors: List[str] = []
        self._samples: List[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = time.monotonic()

    def sample_now(self) -> Sample:
        metrics: Dict[str, float] = {}
        if self.metrics_url:
            try:
                metrics = scrape(self.metrics_url)
            except (urllib.error.URLError, OSError, MetricsFormatError) as exc:
                self._note(f"metrics: {exc}")
        rss: Dict[str, int] = {}
        if self.server_pid:
            rss = {p.name: p.rss_bytes for p in procmem.server_memory(self.server_pid)}
        sample = Sample(time.monotonic() - self._t0, metrics, rss)
        with self._lock:
            self._samples.append(sample)
        return sample

    def _note(self, message: str) -> None:
        with self._lock:
            if len(self.errors) < 20:
                self.errors.append(message)

    def samples(self) -> List[Sample]:
        with self._lock:
            return list(self._samples)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_now()

    def start(self) -> "MetricsSampler":
        self.sample_now()
        self._thread = threading.Thread(target=self._loop, name="latte-metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sample_now()

    def __enter__(self) -> "MetricsSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
