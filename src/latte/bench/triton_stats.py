"""Triton's statistics API (/v2/models/M/stats): counts, and batch sizes from their deltas."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Dict


class StatsError(RuntimeError):
    """The statistics endpoint did not answer, or not for the model asked for."""


@dataclass
class ModelStats:
    inference_count: int = 0      # requests' rows executed (a batch of 8 rows counts 8)
    execution_count: int = 0      # model executions (one per batch)
    success_count: int = 0
    fail_count: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    batches: Dict[int, int] = field(default_factory=dict)   # batch size -> executions

    def minus(self, before: "ModelStats") -> "ModelStats":
        sizes = set(self.batches) | set(before.batches)
        return ModelStats(
            self.inference_count - before.inference_count, self.execution_count - before.execution_count,
            self.success_count - before.success_count, self.fail_count - before.fail_count,
            self.queue_ns - before.queue_ns, self.compute_ns - before.compute_ns,
            {s: self.batches.get(s, 0) - before.batches.get(s, 0) for s in sorted(sizes)
             if self.batches.get(s, 0) - before.batches.get(s, 0) > 0},
        )

    @property
    def mean_batch_size(self) -> float:
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def as_dict(self) -> dict:
        return {
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "success_count": self.success_count, "fail_count": self.fail_count,
            "mean_batch_size": round(self.mean_batch_size, 3),
            "queue_us_per_request": round(self.queue_ns / 1000 / self.success_count, 1) if self.success_count else 0.0,
            "compute_us_per_execution": round(self.compute_ns / 1000 / self.execution_count, 1)
            if self.execution_count else 0.0,
            "batch_size_counts": {str(k): v for k, v in sorted(self.batches.items())},
        }


def parse_stats(payload: dict, model: str) -> ModelStats:
    entries = [m for m in payload.get("model_stats", []) if m.get("name") == model]
    if not entries:
        raise StatsError(f"the statistics of model {model!r} are missing from the server's answer")
    stats = ModelStats()
    for entry in entries:  # one per loaded version
        infer = entry.get("inference_stats", {})
        stats.inference_count += int(entry.get("inference_count", 0))
        stats.execution_count += int(entry.get("execution_count", 0))
        stats.success_count += int(infer.get("success", {}).get("count", 0))
        stats.fail_count += int(infer.get("fail", {}).get("count", 0))
        stats.queue_ns += int(infer.get("queue", {}).get("ns", 0))
        stats.compute_ns += sum(int(infer.get(k, {}).get("ns", 0))
                                for k in ("compute_input", "compute_infer", "compute_output"))
        for batch in entry.get("batch_stats", []):
            size = int(batch["batch_size"])
            stats.batches[size] = stats.batches.get(size, 0) + int(batch.get("compute_infer", {}).get("count", 0))
    return stats


def fetch_stats(http_url: str, model: str, timeout: float = 5.0) -> ModelStats:
    """Current cumulative statistics of `model` from a server's HTTP endpoint (host:port)."""
    url = f"http://{http_url}/v2/models/{model}/stats"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse_stats(json.loads(response.read()), model)
    except urllib.error.HTTPError as exc:
        raise StatsError(f"GET {url} answered {exc.code}: {exc.read().decode(errors='replace')[:200]}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise StatsError(f"GET {url} failed: {exc}") from None
