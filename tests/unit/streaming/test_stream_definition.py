"""stream.json is checked once at load: each mistake is a ConfigError naming the file and the tensor."""

import json

import pytest

from counting_stream import write_counting_stream
from latte.backend.errors import ConfigError
from latte.backend.streaming.definition import load_stream


@pytest.fixture
def path(tmp_path):
    return write_counting_stream(tmp_path)


def rewrite(path, **changes):
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def test_a_correct_model_names_its_state_cache_and_end(path):
    definition = load_stream(path)
    assert definition.state == {"token": "next_token"} and definition.start_inputs == ("x",)
    assert (definition.cache.block_tokens, definition.cache.row_dims) == (4, (1,))
    assert definition.end_tokens == (100,) and definition.done == "done"


@pytest.mark.parametrize("changes, wording", [
    ({"format": "latte-graph/1"}, 'not a latte streaming model (expected "format": "latte-stream/1")'),
    ({"state": {"token": "following"}}, "step.json declares no output 'following' (the next 'token')"),
    ({"state": {"hidden": "next_token"}}, "start.json declares no output 'hidden' (state)"),
    ({"cache": {"name": "cache", "lengths": "cache_lengths", "row": "y", "max_tokens": 8}},
     "a cache row has fixed dims and one data type in both graphs"),
    ({"cache": {"name": "cache", "lengths": "cache_lengths", "row": "next_token", "max_tokens": 8}},
     "a cache row has fixed dims and one data type in both graphs"),
    ({"cache": {"name": "token", "lengths": "cache_lengths", "row": "cache_row", "max_tokens": 8}},
     "the cache is [-1, ...row] where start writes it and step reads it"),
    ({"cache": {"name": "total", "lengths": "cache_lengths", "row": "cache_row", "max_tokens": 8}},
     "step.json declares no input 'total' (the cache so far)"),
    ({"token": "y"}, "'token' must name a state tensor (token), got 'y'"),
    ({"done": "y"}, "'y' is TYPE_BOOL [1], got TYPE_INT64 [1]"),
    ({"cache": None}, "step.json reads ['cache', 'cache_lengths'], which is neither state nor the cache"),
])
def test_each_mistake_is_refused_naming_what_is_wrong(path, changes, wording):
    rewrite(path, **changes)
    with pytest.raises(ConfigError) as refused:
        load_stream(path)
    assert wording in str(refused.value) and str(path) in str(refused.value)
