"""`latte verify` of a streaming model: serve the repository, keep as many concurrent streams
open as the model's settings were derived for (each client sends its next prompt when its
last stream ends, as a chat client does), and check both SLOs: time to first token and the
time between tokens, at P99. When one fails, the one setting to change comes from which did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from latte.backend.streaming.options import DEFAULTS
from latte.bench.streams import StreamFigures, measure_streams, warm_streams
from latte.generator.operating_point import read_operating_points

PROMPT_INPUT = "text_input"


class StreamVerifyError(RuntimeError):
    """The streaming model cannot be verified as asked."""


@dataclass
class StreamVerifyReport:
    model: str
    ttft_slo_ms: float
    itl_slo_ms: float
    streams: int
    max_tokens: int
    figures: StreamFigures
    load_source: str
    suggestion: Optional[str] = None

    @property
    def slo_met(self) -> bool:
        f = self.figures
        return (not f.errors and f.ttft_p99_ms is not None and f.itl_p99_ms is not None
                and f.ttft_p99_ms <= self.ttft_slo_ms and f.itl_p99_ms <= self.itl_slo_ms)

    def text(self) -> str:
        f = self.figures
        verdict = "hold" if self.slo_met else "do NOT hold"
        lines = [f"{self.model}: TTFT P99 {_ms(f.ttft_p99_ms)} vs SLO {self.ttft_slo_ms:g} ms, inter-token P99 "
                 f"{_ms(f.itl_p99_ms)} vs SLO {self.itl_slo_ms:g} ms: the SLOs {verdict}",
                 f"  load: {self.streams} concurrent streams of {self.max_tokens} outputs ({self.load_source})",
                 f"  {f.tokens_per_s:.0f} tokens/s, {f.started} streams started, {f.in_flight:.1f} in flight on "
                 f"average; TTFT P50 {_ms(f.ttft_p50_ms)}, inter-token P50 {_ms(f.itl_p50_ms)}"
                 + (f"; {f.errors} stream(s) failed" if f.errors else "")]
        if self.suggestion:
            lines.append(f"  suggestion: {self.suggestion}")
        return "\n".join(lines)


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _parameter(config, key: str) -> Optional[int]:
    raw = config.parameters[key].string_value if key in config.parameters else ""
    return int(raw) if raw.strip().isdecimal() else None  # isdigit() would pass a superscript int() refuses


def suggest_streams(config, report: StreamVerifyReport) -> Optional[str]:
    """One corrected setting, from which SLO failed; None when both hold."""
    if report.slo_met:
        return None
    f = report.figures
    # The measured load, which --concurrency may have set below the model's max_streams.
    configured = _parameter(config, "max_streams") or report.streams
    streams = min(report.streams, configured)
    joins = _parameter(config, "joins_per_iteration") or 1
    if f.errors:
        return (f"{config.name}: {f.errors} stream(s) ended with an error; the server log says why (a full waiting "
                "queue, a cache too small for the prompts, a failing step)")
    if f.itl_p99_ms is None or f.ttft_p99_ms is None:
        return f"{config.name}: no stream produced two outputs in the window; lengthen --measurement-ms"
    if f.itl_p99_ms > report.itl_slo_ms:
        lower = max(1, int(streams * report.itl_slo_ms / f.itl_p99_ms))
        if lower < streams:
            return (f"{config.name}: an iteration of {streams} live streams takes {f.itl_p99_ms:.1f} ms at P99; lower "
                    f"max_streams from {streams} to {lower} (or re-run `latte generate` with a profile taken on a "
                    "quieter host)")
        return (f"{config.name}: one stream's iteration already misses the inter-token SLO; relax it, or use a faster "
                "model")
    if joins < streams:
        return (f"{config.name}: tokens come on time but first tokens wait to join ({f.ttft_p99_ms:.1f} ms at P99); "
                f"raise joins_per_iteration from {joins} to {min(streams, joins * 2)}")
    return (f"{config.name}: every waiting stream joins at once and TTFT still misses ({f.ttft_p99_ms:.1f} ms at P99): "
            f"lower max_streams from {streams} to {max(1, streams // 2)}, so iterations are shorter")


def verify_streams(repo: Path, config, ttft_ms: Optional[float] = None, itl_ms: Optional[float] = None,
                   concurrency: Optional[int] = None, measurement_ms: int = 3000, url: Optional[str] = None,
                   install=None) -> StreamVerifyReport:
    """Measure the streaming model `config` (a ModelConfig of REPO) under its planned load."""
    model = config.name
    if PROMPT_INPUT not in {t.name for t in config.input}:
        raise StreamVerifyError(f"{model}: verify sends prompts as {PROMPT_INPUT!r} (Triton's vLLM backend's "
                                "interface); the model declares no such input")
    planned = read_operating_points(Path(repo)).get(model)
    ttft = ttft_ms if ttft_ms is not None else (planned.ttft_ms if planned else None)
    itl = itl_ms if itl_ms is not None else (planned.slo_ms if planned else None)
    if ttft is None or itl is None:
        raise StreamVerifyError(f"give --ttft-ms and --inter-token-ms: {repo} has no plan from `latte generate` "
                                f"naming {model}'s SLOs")
    if ttft <= 0 or itl <= 0:
        raise StreamVerifyError(f"the SLOs must be positive, got TTFT {ttft} ms and inter-token {itl} ms")
    if concurrency is not None:
        streams, source = concurrency, "--concurrency"
    elif planned is not None and planned.streams:
        streams, source = planned.streams, "max_streams as `latte generate` derived it"
    else:
        streams, source = _parameter(config, "max_streams") or DEFAULTS.max_streams, "the config's max_streams"
    if streams < 1:
        raise StreamVerifyError(f"--concurrency must be >= 1, got {streams}")
    tokens = (planned.max_tokens if planned is not None and planned.max_tokens else None) \
        or _parameter(config, "max_tokens") or DEFAULTS.max_tokens
    seconds = measurement_ms / 1000.0

    def measure(grpc_url: str) -> StreamFigures:
        warm_streams(grpc_url, model)
        return measure_streams(grpc_url, model, streams, seconds, tokens)

    if url:
        figures = measure(url)
    else:
        from latte.triton import TritonServer

        with TritonServer(repo, install=install) as server:
            figures = measure(server.grpc_url)
    report = StreamVerifyReport(model, ttft, itl, streams, tokens, figures, source)
    report.suggestion = suggest_streams(config, report)
    return report
