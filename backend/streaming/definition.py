"""A streaming model as its version folder's `stream.json` declares it, checked once at load.

    {"format": "latte-stream/1",
     "start": "start.json",                   # a latte-graph/1: a request's inputs -> state, first output
     "step": "step.json",                     # a latte-graph/1: live streams' state -> next state, output
     "state": {"token": "next_token"},        # start writes `token`; step reads it, writes `next_token`
     "cache": {"name": "kv", "lengths": "kv_lengths", "row": "kv_row",
               "block_tokens": 16, "max_tokens": 256},                      # optional
     "token": "token", "end_tokens": [0],     # optional: the state compared with end tokens
     "done": "done"}                          # optional: a step output, true on a stream's last

The start graph reads the request's inputs it declares and writes every state tensor, every
output the model config declares, and the cache (one row per prompt token: [-1, ...row]). The
step graph reads every state tensor, the cache padded to the longest stream ([-1, ...row])
with each stream's length (`lengths`, [1] INT64), and writes each state tensor's next value,
every output, the new token's cache row (`row`, [...row]) and `done` if declared. Both graphs
are fused-model graphs (docs/pipelines.md): their steps are TorchScript, torch.export, ONNX
or Python functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from latte.backend.errors import ConfigError
from latte.backend.graph.definition import GraphDefinition, TensorDeclaration, load_graph, read_declaration

STREAM_FORMAT = "latte-stream/1"


@dataclass(frozen=True)
class CacheDeclaration:
    name: str            # start's output and step's input: the rows so far
    lengths: str         # step's input: each stream's rows so far, [1] INT64
    row: str             # step's output: the new token's row
    block_tokens: int    # rows per block
    max_tokens: int      # rows a stream may hold (the model's context)
    row_dims: Tuple[int, ...]
    data_type: str


@dataclass(frozen=True)
class StreamDefinition:
    path: Path
    start: GraphDefinition
    step: GraphDefinition
    state: Dict[str, str]                 # start's output (step's input) -> step's output
    cache: Optional[CacheDeclaration]
    token: Optional[str]                  # a state tensor: compared with end_tokens
    end_tokens: Tuple[int, ...]
    done: Optional[str]                   # a step output

    @property
    def start_inputs(self) -> Tuple[str, ...]:
        return tuple(t.name for t in self.start.inputs)


def _declared(graph: GraphDefinition, side: str) -> Dict[str, TensorDeclaration]:
    return {t.name: t for t in (graph.inputs if side == "inputs" else graph.outputs)}


def _require(graph: GraphDefinition, side: str, name: str, role: str, path: Path) -> TensorDeclaration:
    found = _declared(graph, side).get(name)
    if found is None:
        raise ConfigError(f"{path}: {graph.path.name} declares no {side[:-1]} {name!r} ({role})")
    return found


def _cache(raw, start: GraphDefinition, step: GraphDefinition, path: Path) -> Optional[CacheDeclaration]:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("name", "lengths", "row")):
        raise ConfigError(f"{path}: 'cache' must give the names 'name', 'lengths' and 'row'")
    try:
        block_tokens, max_tokens = int(raw.get("block_tokens", 16)), int(raw["max_tokens"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}: 'cache' needs integer 'max_tokens' (the rows a stream may hold) and "
                          "'block_tokens'") from None
    if block_tokens < 1 or max_tokens < 1:
        raise ConfigError(f"{path}: cache block_tokens and max_tokens must be >= 1")
    made = _require(start, "outputs", raw["name"], "the prompt's cache rows", path)
    read = _require(step, "inputs", raw["name"], "the cache so far", path)
    lengths = _require(step, "inputs", raw["lengths"], "each stream's cache length", path)
    row = _require(step, "outputs", raw["row"], "the new token's cache row", path)
    if made.dims[:1] != (-1,) or read.dims != made.dims or row.dims != made.dims[1:]:
        raise ConfigError(f"{path}: the cache is [-1, ...row] where start writes it and step reads it, and step's "
                          f"{raw['row']!r} is one row: got {list(made.dims)}, {list(read.dims)} and {list(row.dims)}")
    if -1 in row.dims or not (made.data_type == read.data_type == row.data_type):
        raise ConfigError(f"{path}: a cache row has fixed dims and one data type in both graphs")
    if lengths.dims != (1,) or lengths.data_type != "TYPE_INT64":
        raise ConfigError(f"{path}: step's {raw['lengths']!r} is TYPE_INT64 [1], got {lengths.data_type} "
                          f"{list(lengths.dims)}")
    return CacheDeclaration(raw["name"], raw["lengths"], raw["row"], block_tokens, max_tokens, row.dims,
                            row.data_type)


def _state(raw, start: GraphDefinition, step: GraphDefinition, path: Path) -> Dict[str, str]:
    if not isinstance(raw, dict) or not raw or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in raw.items()):
        raise ConfigError(f"{path}: 'state' must map each state tensor (start's output, step's input) to the "
                          "step output that holds its next value")
    for name, following in raw.items():
        made = _require(start, "outputs", name, "state", path)
        read = _require(step, "inputs", name, "state", path)
        written = _require(step, "outputs", following, f"the next {name!r}", path)
        if -1 in made.dims or not (made.dims == read.dims == written.dims) or \
                not (made.data_type == read.data_type == written.data_type):
            raise ConfigError(f"{path}: state {name!r} has one fixed shape and type where start writes it, step "
                              f"reads it and step writes {following!r}")
    return dict(raw)


def check_outputs(definition: StreamDefinition, outputs: Mapping[str, str]) -> None:
    """Both graphs answer every output the model config declares (name -> data type)."""
    for graph in (definition.start, definition.step):
        declared = _declared(graph, "outputs")
        for name, data_type in outputs.items():
            if name not in declared:
                raise ConfigError(f"{definition.path}: {graph.path.name} does not write the model's output {name!r}")
            if declared[name].data_type != data_type:
                raise ConfigError(f"{definition.path}: {graph.path.name} writes {name!r} as {declared[name].data_type};"
                                  f" the model config declares {data_type}")


def load_stream(path: Path) -> StreamDefinition:
    """Read and check a stream.json and its two graphs; raises ConfigError naming the file."""
    path = Path(path)
    raw = read_declaration(path, STREAM_FORMAT, "streaming model")
    graphs = {}
    for key in ("start", "step"):
        if not isinstance(raw.get(key), str):
            raise ConfigError(f"{path}: {key!r} must name a graph file (latte-graph/1) beside it")
        graphs[key] = load_graph(path.parent / raw[key])
    start, step = graphs["start"], graphs["step"]
    state = _state(raw.get("state"), start, step, path)
    cache = _cache(raw.get("cache"), start, step, path)
    token = raw.get("token")
    if token is not None and token not in state:
        raise ConfigError(f"{path}: 'token' must name a state tensor ({', '.join(state)}), got {token!r}")
    end_tokens = raw.get("end_tokens") or []
    if not isinstance(end_tokens, list) or not all(isinstance(t, int) for t in end_tokens):
        raise ConfigError(f"{path}: 'end_tokens' must be a list of integers")
    if end_tokens and token is None:
        raise ConfigError(f"{path}: 'end_tokens' needs 'token', the state tensor they are compared with")
    done = raw.get("done")
    if done is not None:
        found = _require(step, "outputs", done, "whether a stream is done", path)
        if found.data_type != "TYPE_BOOL" or found.dims != (1,):
            raise ConfigError(f"{path}: {done!r} is TYPE_BOOL [1], got {found.data_type} {list(found.dims)}")
    expected_step_inputs = set(state) | ({cache.name, cache.lengths} if cache else set())
    extra = sorted({t.name for t in step.inputs} - expected_step_inputs)
    if extra:
        raise ConfigError(f"{path}: step.json reads {extra}, which is neither state nor the cache")
    return StreamDefinition(path=path, start=start, step=step, state=state, cache=cache, token=token,
                            end_tokens=tuple(end_tokens), done=done)
