"""Human-readable account of a derivation, printed by `latte profile --slo-ms` and `latte generate`."""

from __future__ import annotations

from latte.generator.derive import Derivation


def derivation_report(name: str, d: Derivation) -> str:
    head = (f"{name}: max_batch_size {d.max_batch_size}, {d.instance_count} x {d.instance_kind}, "
            f"worst case {d.worst_case_ms:.2f} ms, predicted {d.throughput:.0f} rows/s")
    return head + "\n" + d.explain()
