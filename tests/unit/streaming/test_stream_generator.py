"""The generator's part for streaming models: a spec declares one with its two SLOs, `latte
profile` measures its iterations against the number of live streams, the derivation picks
max_streams and joins_per_iteration that keep both SLOs, and `latte generate` renders a
decoupled config Triton accepts."""

import json
import textwrap

import pytest
from tritonclient.grpc import model_config_pb2

from latte.generator.derive_streams import (SLO_SHARE, StreamDerivationError, derive_streams, poisson_quantile)
from latte.generator.profile_data import ProfileError
from latte.generator.spec import SpecError, load_spec
from latte.generator.stream_profile import ResponseCost, StreamPoint, StreamProfile

RESPONSES = ResponseCost(response_ms=0.2, first_response_ms=1.0, jitter_ms=2.0)


def linear_profile(per_stream_ms=0.1, base_ms=1.0, start_ms=2.0, top=64, responses=RESPONSES):
    """A model whose step costs base + n x per_stream and whose start of j costs start + j x per_stream."""
    levels = [1, 2, 4, 8, 16, 32, 64]
    points = [StreamPoint(n, start_ms + n * per_stream_ms, 1.2 * (start_ms + n * per_stream_ms),
                          base_ms + n * per_stream_ms, 1.2 * (base_ms + n * per_stream_ms))
              for n in levels if n <= top]
    return StreamProfile(stream_file="stream.json", max_tokens=16, intra_op_threads=1, points=points,
                         stop_reason="measured every level", responses=responses)


def test_the_settings_keep_both_slos_with_room_and_one_stream_more_would_not_serve_more():
    profile = linear_profile()
    d = derive_streams(profile, ttft_ms=60, itl_ms=15, max_tokens=16)
    assert d.itl_p99_ms <= 15 * SLO_SHARE and d.ttft_p99_ms <= 60 * SLO_SHARE
    assert 1 <= d.max_streams <= 64 and 1 <= d.joins_per_iteration <= d.max_streams
    # Streams replaced as they end bring max_streams / max_tokens a iteration: joins cover their P99.
    assert d.joins_per_iteration >= poisson_quantile(d.max_streams / 16)
    more = derive_streams(profile, ttft_ms=1000, itl_ms=1000, max_tokens=16)
    assert more.max_streams > d.max_streams and more.tokens_per_s > d.tokens_per_s
    assert d.parameters == {"max_streams": str(d.max_streams), "joins_per_iteration": str(d.joins_per_iteration),
                            "max_tokens": "16"}
    report = d.report("textgen")
    assert report.startswith(f"textgen: max_streams {d.max_streams}, joins_per_iteration {d.joins_per_iteration}")
    assert "80% of the SLOs" in report


def test_a_tighter_inter_token_slo_gives_fewer_streams():
    profile = linear_profile()
    loose, tight = (derive_streams(profile, ttft_ms=500, itl_ms=itl) for itl in (30, 12))
    assert tight.max_streams < loose.max_streams
    assert tight.itl_p99_ms <= 12 * SLO_SHARE < loose.itl_p99_ms


def test_an_arrival_rate_sets_the_joins_and_a_rate_past_what_the_settings_finish_is_said():
    profile = linear_profile()
    calm = derive_streams(profile, ttft_ms=500, itl_ms=30, arrival_rate=1.0)
    rate = 3 * calm.streams_per_s
    busy = derive_streams(profile, ttft_ms=500, itl_ms=30, arrival_rate=rate)
    assert "WARNING" not in calm.report("m")
    assert busy.joins_per_iteration > calm.joins_per_iteration
    assert f"WARNING: {rate:g} streams/s arriving is more than" in busy.report("m")


def test_slos_no_stream_count_keeps_are_refused_with_the_figures():
    with pytest.raises(StreamDerivationError, match=r"no number of live streams keeps both SLOs: even one "
                                                    r"stream's iteration predicts inter-token P99 [\d.]+ ms"):
        derive_streams(linear_profile(), ttft_ms=5, itl_ms=1)
    with pytest.raises(StreamDerivationError, match="the SLOs must be positive"):
        derive_streams(linear_profile(), ttft_ms=0, itl_ms=10)


def test_poisson_quantiles():
    assert poisson_quantile(0) == 0
    assert poisson_quantile(2.0) == 6      # P(X <= 5) = 0.983, P(X <= 6) = 0.995
    assert poisson_quantile(0.5) == 3
    assert 1000 < poisson_quantile(1000.0) < 1100   # past exp's range: the normal approximation


def test_a_profile_reads_between_its_levels_and_past_the_last_and_round_trips(tmp_path):
    profile = linear_profile()
    assert profile.point(16) == profile.points[4]
    between = profile.point(24)
    assert profile.point(16).step_mean_ms < between.step_mean_ms < profile.point(32).step_mean_ms
    assert profile.point(128).step_mean_ms == pytest.approx(2 * profile.point(64).step_mean_ms)
    path = profile.save(tmp_path / "profile.json")
    assert StreamProfile.load(path) == profile
    (tmp_path / "batch.json").write_text(json.dumps({"model_file": "m.onnx", "points": []}))
    with pytest.raises(ProfileError, match="not a streaming model's profile"):
        StreamProfile.load(tmp_path / "batch.json")


@pytest.fixture(scope="module")
def gru(tmp_path_factory):
    from latte.examples.streams import write_stream_model

    return write_stream_model(tmp_path_factory.mktemp("examples"), "textgen_gru", "gru") / "1" / "stream.json"


def test_profiling_measures_each_level_in_process(gru):
    from latte.generator.stream_profile import profile_stream

    lines = []
    profile = profile_stream(gru, levels=(1, 4), max_tokens=4, rounds=1, log=lines.append)
    assert [p.streams for p in profile.points] == [1, 4]
    assert all(p.step_mean_ms > 0 and p.start_mean_ms > 0 and p.step_p99_ms >= p.step_mean_ms
               for p in profile.points)
    assert profile.stop_reason == "measured every level up to 4" and len(lines) == 2
    assert profile.responses is None  # the machine's cost is measured on a server, apart


def test_profiling_stops_at_the_level_whose_step_passes_the_ceiling(gru):
    from latte.generator.stream_profile import profile_stream

    profile = profile_stream(gru, levels=(1, 2, 4), max_tokens=3, rounds=1, max_iteration_ms=1e-6)
    assert [p.streams for p in profile.points] == [1]
    assert profile.stop_reason == "a step of 1 streams passed 1e-06 ms"
    assert not profile.covers(itl_ms=10.0) and profile.covers(itl_ms=1e-6)


def _spec(tmp_path, body: str):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_spec_declares_a_streaming_model_and_its_errors_name_the_line(tmp_path, gru):
    spec = load_spec(_spec(tmp_path, f"""\
        models:
          - name: textgen
            stream: {gru}
            ttft_ms: 200
            inter_token_ms: 40
            max_tokens: 24
        """))
    (model,) = spec.models
    assert (model.runtime, model.stream.ttft_ms, model.stream.inter_token_ms, model.stream.max_tokens) == \
        ("stream", 200.0, 40.0, 24)
    with pytest.raises(SpecError, match=r"spec.yaml:2: models\[0\].inter_token_ms: missing; a streaming model needs"):
        load_spec(_spec(tmp_path, f"""\
            models:
              - {{name: textgen, stream: {gru}, ttft_ms: 200}}
            """))
    with pytest.raises(SpecError, match=r"models\[0\].slo_ms: unknown key"):
        load_spec(_spec(tmp_path, f"""\
            models:
              - {{name: textgen, stream: {gru}, ttft_ms: 200, inter_token_ms: 40, slo_ms: 5}}
            """))
    broken = tmp_path / "broken" / "stream.json"
    broken.parent.mkdir()
    broken.write_text(json.dumps({"format": "latte-stream/1", "start": "nowhere.json", "step": "step.json"}))
    with pytest.raises(SpecError, match=r"models\[0\].stream: .*nowhere.json"):
        load_spec(_spec(tmp_path, f"""\
            models:
              - {{name: textgen, stream: {broken}, ttft_ms: 200, inter_token_ms: 40}}
            """))


def test_generate_renders_a_decoupled_model_with_the_derived_settings_and_plans_its_verification(tmp_path, gru):
    from latte.generator.generate import generate
    from latte.generator.operating_point import read_operating_points
    from latte.generator.validate import validate_repository

    linear_profile().save(tmp_path / "textgen.json")
    spec = _spec(tmp_path, f"""\
        models:
          - name: textgen
            stream: {gru}
            ttft_ms: 100
            inter_token_ms: 20
            profile: textgen.json
            overrides: {{parameters: {{max_waiting: 32}}}}
        """)
    lines = []
    (plan,) = generate(spec, tmp_path / "repo", log=lines.append)
    d = plan.stream_derivation
    config = validate_repository(tmp_path / "repo")["textgen"]
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 0
    assert [t.name for t in config.input] == ["text_input", "stream", "exclude_input_in_output",
                                              "sampling_parameters", "return_finish_reason",
                                              "return_num_output_tokens"]
    assert [(t.name, model_config_pb2.DataType.Name(t.data_type)) for t in config.output] == [
        ("text_output", "TYPE_STRING"), ("finish_reason", "TYPE_STRING"), ("num_output_tokens", "TYPE_UINT32")]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["max_streams"] == str(d.max_streams) and params["joins_per_iteration"] == str(d.joins_per_iteration)
    assert (params["max_waiting"], params["model_file"], params["max_tokens"]) == ("32", "stream.json", "16")
    version = tmp_path / "repo" / "textgen" / "1"
    assert sorted(p.name for p in version.iterdir()) == ["start.json", "step.json", "steps", "stream.json"]
    point = read_operating_points(tmp_path / "repo")["textgen"]
    assert (point.slo_ms, point.ttft_ms, point.streams, point.max_tokens) == (20.0, 100.0, d.max_streams, 16)


def test_the_config_of_a_stream_without_outputs_to_send_is_refused(gru):
    from dataclasses import replace

    from latte.backend.streaming.definition import load_stream
    from latte.generator.stream_model import stream_context

    definition = load_stream(gru)
    context = stream_context("m", definition, {"max_streams": 4})
    assert context["decoupled"] and context["parameters"] == {"max_streams": "4"}
    bare = replace(definition, start=replace(definition.start, outputs=tuple(
        t for t in definition.start.outputs if t.name != "text_output")))
    with pytest.raises(ValueError, match="write no output in common beyond the state and cache"):
        stream_context("m", bare, {})


def test_graphs_that_write_an_output_latte_makes_itself_are_refused_naming_it(gru):
    from dataclasses import replace

    from latte.backend.errors import ConfigError
    from latte.backend.streaming.definition import load_stream
    from latte.generator.stream_model import stream_context

    definition = load_stream(gru)

    def renamed(graph):
        return replace(graph, outputs=tuple(replace(t, name="finish_reason") if t.name == "text_output" else t
                                            for t in graph.outputs))

    clashing = replace(definition, start=renamed(definition.start), step=renamed(definition.step))
    with pytest.raises(ConfigError, match="model 'm': the graphs write 'finish_reason', which latte makes itself"):
        stream_context("m", clashing, {})
