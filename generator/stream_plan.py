"""A streaming model of a spec, planned: its profile (taken here when the spec names none, and
kept beside the others), its settings derived from its two SLOs, and its model folder."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from latte.generator.derive_streams import StreamDerivationError, derive_streams
from latte.generator.stream_profile import ResponseCost, StreamProfile, profile_stream


def load_or_profile_stream(model, profiles_dir: Path, log: Callable[[str], None],
                           response_cost: Callable[[], Optional[ResponseCost]] = lambda: None) -> StreamProfile:
    """The spec's profile, else one kept from an earlier generate (newer than every file of the
    model, at the spec's max_tokens, swept up to its inter-token SLO), else a new one. A profile
    that holds no response cost, or one kept here, gets this machine's (kept a week; generate
    --recalibrate measures it again)."""
    if model.profile is not None:
        profile = StreamProfile.load(model.profile)
        if profile.responses is None:
            profile.responses = response_cost()
        return profile
    target = Path(profiles_dir) / f"{model.name}.json"
    tokens = model.stream.max_tokens
    newest = max(path.stat().st_mtime for path in model.file.parent.rglob("*") if path.is_file())
    if target.exists() and target.stat().st_mtime >= newest:
        kept = StreamProfile.load(target)
        if kept.max_tokens == tokens and kept.intra_op_threads == model.intra_op_threads and \
                kept.covers(model.stream.inter_token_ms):
            log(f"{model.name}: reusing profile {target}")
            kept.responses = response_cost() or kept.responses
            return kept
    log(f"{model.name}: profiling {model.file} against the number of live streams (no profile in the spec)")
    profile = profile_stream(model.file, max_tokens=max(2, tokens), intra_op_threads=model.intra_op_threads,
                             max_iteration_ms=model.stream.inter_token_ms, log=log)
    profile.responses = response_cost()
    Path(profiles_dir).mkdir(parents=True, exist_ok=True)
    profile.save(target)
    return profile


def plan_stream_model(spec, model, profile: StreamProfile):
    """The model folder of a streaming model: a decoupled latte config with the derived settings
    (the spec's overrides win), and the files beside its stream.json."""
    from latte.backend.streaming.definition import load_stream
    from latte.generator.generate import ModelPlan
    from latte.generator.stream_model import stream_context, version_files

    slo = model.stream
    try:
        derivation = derive_streams(profile, slo.ttft_ms, slo.inter_token_ms, slo.max_tokens, model.arrival_rate)
    except StreamDerivationError as exc:
        raise spec.source.error(model.path + ("inter_token_ms",), str(exc)) from None
    parameters = {"model_file": model.file.name, "runtime": "stream", **derivation.parameters,
                  "intra_op_threads": model.intra_op_threads,
                  **{k: str(v) for k, v in (model.overrides.get("parameters") or {}).items()}}
    try:
        context = stream_context(model.name, load_stream(model.file), parameters)
    except ValueError as exc:
        raise spec.source.error(model.path + ("stream",), str(exc)) from None
    plan = ModelPlan(model.name, "latte", context, version_files(model.file))
    plan.stream_derivation = derivation
    plan.stream_profile = profile
    return plan
