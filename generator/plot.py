"""The profile as a picture: latency and throughput against batch size, one line per bucket."""

from __future__ import annotations

from pathlib import Path

from latte.generator.profile_data import Profile


def plot_profile(profile: Profile, path: Path, slo_ms: float = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4))
    for length in profile.buckets():
        curve = profile.curve(length)
        label = "fixed shape" if length is None else f"length {length}"
        sizes = [p.batch_size for p in curve]
        line, = lat.plot(sizes, [p.p99_ms for p in curve], marker="o", label=f"{label} P99")
        lat.plot(sizes, [p.p50_ms for p in curve], linestyle="--", color=line.get_color(), label=f"{label} P50")
        thr.plot(sizes, [p.throughput for p in curve], marker="o", color=line.get_color(), label=label)
    if slo_ms:
        lat.axhline(slo_ms / 2, color="red", linestyle=":", label="SLO / 2")
    for ax, title, unit in ((lat, "latency", "ms"), (thr, "throughput", "rows/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(unit)
        ax.set_title(f"{Path(profile.model_file).name}: {title}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
