"""A small streaming model of Python function steps, for tests of the streaming engine:

- start: a request's `x` (INT64 [1], at least 1) -> token = x, y = x, and x cache rows, each [x]
  (a prompt of x tokens);
- step: token -> next_token = token + 1, y = token + 1, one cache row [token + 1], and `total`,
  the sum of the stream's cache rows so far (read back through the blocks, masked by length).

Token 13 fails the step (a model failure), x = 0 is refused by start (a bad request), token
100 is the end token, and a token divisible by 50 says the stream is done.
"""

import json
from pathlib import Path

from latte.backend.graph.graph import Graph
from latte.backend.streaming.definition import load_stream
from latte.backend.streaming.engine import StreamEngine
from latte.backend.streaming.options import StreamOptions
from latte.backend.streaming.runner import StreamRunner
from latte.backend.streaming.scheduler import StreamScheduler

STEPS = '''\
import numpy as np


def start(x):
    if (x < 1).any():
        raise ValueError("x must be at least 1")
    width = int(x.max())
    cache = np.zeros((len(x), width, 1), dtype=np.float32)
    for row, n in zip(cache, x[:, 0]):
        row[:n, 0] = n
    return x.copy(), x.copy(), cache, np.zeros((len(x), 1), dtype=np.float32)


def step(token, cache, lengths):
    if (token == 13).any():
        raise RuntimeError("unlucky thirteen")
    following = token + 1
    total = np.array([[cache[i, :n, 0].sum()] for i, n in enumerate(lengths[:, 0])], dtype=np.float32)
    done = (following % 50 == 0)
    return following, following.copy(), following.astype(np.float32), total, done
'''


def _tensor(name, data_type, dims):
    return {"name": name, "data_type": data_type, "dims": dims}


def write_counting_stream(folder: Path, block_tokens: int = 4, max_tokens: int = 64) -> Path:
    """The model's version folder (folder/1); gives the path of its stream.json."""
    version = Path(folder) / "1"
    (version / "steps" / "count" / "1").mkdir(parents=True, exist_ok=True)
    (version / "steps" / "count" / "1" / "model.py").write_text(STEPS)
    x, token, y = _tensor("x", "TYPE_INT64", [1]), _tensor("token", "TYPE_INT64", [1]), _tensor("y", "TYPE_INT64", [1])
    cache, total = _tensor("cache", "TYPE_FP32", [-1, 1]), _tensor("total", "TYPE_FP32", [1])
    lengths, row = _tensor("cache_lengths", "TYPE_INT64", [1]), _tensor("cache_row", "TYPE_FP32", [1])
    following, done = _tensor("next_token", "TYPE_INT64", [1]), _tensor("done", "TYPE_BOOL", [1])

    def config(name, inputs, outputs):
        return {"name": name, "backend": "python", "max_batch_size": 64, "input": inputs, "output": outputs}

    start = {"format": "latte-graph/1", "inputs": [x], "outputs": [token, y, cache, total], "branches": "inline",
             "samples": [{"x": [2]}, {"x": [3]}],
             "steps": [{"name": "start", "folder": "steps/count", "function": "start",
                        "config": config("start", [x], [token, y, cache, total]),
                        "inputs": {"x": "x"}, "outputs": {"token": "token", "y": "y", "cache": "cache",
                                                          "total": "total"}}]}
    step = {"format": "latte-graph/1", "inputs": [token, cache, lengths], "outputs": [following, y, row, total, done],
            "branches": "inline",
            "steps": [{"name": "count", "folder": "steps/count", "function": "step",
                       "config": config("count", [token, cache, lengths], [following, y, row, total, done]),
                       "inputs": {"token": "token", "cache": "cache", "cache_lengths": "cache_lengths"},
                       "outputs": {"next_token": "next_token", "y": "y", "cache_row": "cache_row", "total": "total",
                                   "done": "done"}}]}
    (version / "start.json").write_text(json.dumps(start))
    (version / "step.json").write_text(json.dumps(step))
    (version / "stream.json").write_text(json.dumps({
        "format": "latte-stream/1", "start": "start.json", "step": "step.json", "state": {"token": "next_token"},
        "cache": {"name": "cache", "lengths": "cache_lengths", "row": "cache_row", "block_tokens": block_tokens,
                  "max_tokens": max_tokens},
        "token": "token", "end_tokens": [100], "done": "done"}))
    return version / "stream.json"


def counting_runner(path: Path, is_cancelled=lambda stream: False, **options) -> StreamRunner:
    """The engine and its loop on the model at `path`, driven by run_once (no thread)."""
    definition = load_stream(path)
    graphs = [Graph(g.path, [t.name for t in g.inputs], [t.name for t in g.outputs], 1, 1)
              for g in (definition.start, definition.step)]
    options = StreamOptions(**{"max_streams": 8, "joins_per_iteration": 4, "cache_blocks": 64, **options})
    engine = StreamEngine("counting", definition, graphs[0], graphs[1], options, ["y", "total"])
    scheduler = StreamScheduler(options.max_streams, options.joins_per_iteration, options.max_waiting)
    return StreamRunner(engine, scheduler, cancel_check_s=0.0, is_cancelled=is_cancelled)
