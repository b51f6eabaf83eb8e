"""The report's figures, drawn with matplotlib's Agg backend and returned as PNG bytes."""

from __future__ import annotations

import io
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

SWEEP_STYLE = {"concurrency": ("#1f77b4", "o", "concurrency sweep"),
               "request_rate": ("#d62728", "s", "Poisson request-rate sweep")}
PERCENTILES = (("p50_ms", "P50", "-"), ("p90_ms", "P90", "--"), ("p99_ms", "P99", ":"))


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def _ok(points: List[dict], kind: str) -> List[dict]:
    return [p for p in points if p["kind"] == kind and "error" not in p]


def latency_throughput(points: List[dict]) -> bytes:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for kind, (color, marker, label) in SWEEP_STYLE.items():
        pts = sorted(_ok(points, kind), key=lambda p: p["throughput"])
        if not pts:
            continue
        x = [p["throughput"] for p in pts]
        ax.plot(x, [p["p99_ms"] for p in pts], color=color, marker=marker, label=f"P99, {label}")
        ax.plot(x, [p["p50_ms"] for p in pts], color=color, marker=marker, alpha=0.45, linestyle="--",
                label=f"P50, {label}")
        for p in pts:
            tag = f"c={p['level']:g}" if kind == "concurrency" else f"{p['level']:g}/s"
            ax.annotate(tag, (p["throughput"], p["p99_ms"]), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=color)
    ax.set_xlabel("throughput (inferences / s)")
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def percentiles_vs_load(points: List[dict]) -> bytes:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, kind, xlabel in ((axes[0], "concurrency", "concurrent requests"),
                             (axes[1], "request_rate", "offered load (requests / s, Poisson)")):
        pts = sorted(_ok(points, kind), key=lambda p: p["level"])
        color = SWEEP_STYLE[kind][0]
        for key, label, style in PERCENTILES:
            ax.plot([p["level"] for p in pts], [p[key] for p in pts], linestyle=style, marker="o", color=color,
                    alpha={"P50": 0.5, "P90": 0.75, "P99": 1.0}[label], label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("latency (ms)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(SWEEP_STYLE[kind][2], fontsize=10)
    return _png(fig)


def queue_compute_split(points: List[dict]) -> bytes:
    pts = [p for p in points if "error" not in p]
    labels = [f"c={p['level']:g}" if p["kind"] == "concurrency" else f"{p['level']:g}/s" for p in pts]
    queue = [p["queue_us"] / 1000 for p in pts]
    compute = [p["compute_us"] / 1000 for p in pts]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x = range(len(pts))
    ax.bar(x, queue, color="#ff7f0e", label="server queue")
    ax.bar(x, compute, bottom=queue, color="#2ca02c", label="server compute (input + infer + output)")
    # Triton times the server side per request; the client's own average is drawn beside it, not
    # stacked, because the two clocks overlap rather than add up.
    ax.plot(list(x), [p["avg_ms"] for p in pts], "k_", markersize=28, markeredgewidth=2.5,
            label="average latency seen by the client")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8, rotation=30)
    ax.set_ylabel("average latency (ms)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def batch_sizes(points: List[dict]) -> bytes:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    totals: Dict[str, Dict[int, int]] = {"concurrency": {}, "request_rate": {}}
    for p in points:
        for size, count in p["server"]["batch_size_counts"].items():
            totals[p["kind"]][int(size)] = totals[p["kind"]].get(int(size), 0) + count
    sizes = sorted(set(totals["concurrency"]) | set(totals["request_rate"]))
    width = 0.4
    for offset, kind in ((-width / 2, "concurrency"), (width / 2, "request_rate")):
        color, _, label = SWEEP_STYLE[kind]
        axes[0].bar([s + offset for s in sizes], [totals[kind].get(s, 0) for s in sizes], width=width, color=color,
                    label=label)
    axes[0].set_xlabel("batch size (rows per model execution)")
    axes[0].set_ylabel("executions")
    from matplotlib.ticker import MaxNLocator

    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
    axes[0].legend(fontsize=8)
    axes[0].grid(alpha=0.3, axis="y")
    for kind, (color, marker, label) in SWEEP_STYLE.items():
        pts = sorted([p for p in points if p["kind"] == kind], key=lambda p: p["level"])
        if kind == "concurrency":
            axes[1].plot([p["level"] for p in pts], [p["server"]["mean_batch_size"] for p in pts], color=color,
                         marker=marker, label="per concurrency level")
    axes[1].set_xlabel("concurrent requests")
    axes[1].set_ylabel("mean batch size")
    axes[1].set_ylim(bottom=0)
    axes[1].grid(alpha=0.3)
    return _png(fig)


def memory_over_time(samples: List[dict], points: List[dict], model: str = None) -> bytes:
    fig, ax = plt.subplots(figsize=(10, 3.8))
    t = [s["t"] for s in samples]
    names = sorted({n for s in samples for n in s["rss"]}, key=lambda n: (n != "tritonserver", n))
    others = 0
    for name in names:
        parts = name.split(":")
        instance = parts[2] if len(parts) > 2 else "?"
        series = [s["rss"].get(name, float("nan")) / 2**20 for s in samples]
        if name == "tritonserver":
            ax.plot(t, series, label="tritonserver", linewidth=2.4, color="black")
        elif model is None or instance.startswith(model + "_"):
            ax.plot(t, series, label=f"stub of {instance} (pid {parts[1]})", linewidth=2.0)
        else:
            # Stubs of models not under load: drawn faintly, as a check that they stay flat.
            ax.plot(t, series, color="#9a9a9a", linewidth=0.9, alpha=0.7,
                    label="stubs of the other models" if others == 0 else None)
            others += 1
    for p in points:
        color = SWEEP_STYLE[p["kind"]][0]
        ax.axvspan(p["t_start"], p["t_end"], color=color, alpha=0.06)
    ax.set_xlabel("seconds since the run started (shaded: load points; blue concurrency, red Poisson)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if names:
        ax.legend(fontsize=8, loc="lower right", framealpha=0.95)
    return _png(fig)
