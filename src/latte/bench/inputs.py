"""Request inputs generated from a served model's own config (any model, not only the examples)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from latte.backend.dtypes import TRITON_TO_NUMPY
from latte.backend.samples import sample_values
from latte.bench.lengths import LengthDistribution
from latte.triton.perf import write_input_data

DEFAULT_MAX_LENGTH = 128


class ModelInputError(ValueError):
    """The model's inputs cannot be generated (unknown type, no such model)."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    data_type: str
    dims: Tuple[int, ...]     # without the batch dimension; -1 marks a variable extent


@dataclass(frozen=True)
class ModelInputs:
    model: str
    inputs: Tuple[InputSpec, ...]
    max_batch_size: int
    max_length: int

    @property
    def variable(self) -> bool:
        return any(-1 in spec.dims for spec in self.inputs)

    def request(self, rng: np.random.Generator, length: int, rows: int = 1) -> Dict[str, np.ndarray]:
        """One request: `rows` rows (with a batch dimension when the model batches), -1 extents = length."""
        feed = {}
        for spec in self.inputs:
            shape = tuple(length if d == -1 else d for d in spec.dims)
            if self.max_batch_size > 0:
                shape = (rows,) + shape
            feed[spec.name] = sample_values(spec.data_type, shape, rng)
        return feed

    def requests(self, rng: np.random.Generator, count: int, lengths: LengthDistribution) -> List[Dict[str, np.ndarray]]:
        drawn = lengths.sample(rng, count, self.max_length) if self.variable else np.ones(count, np.int64)
        return [self.request(rng, int(n)) for n in drawn]


def parse_model_inputs(config: dict) -> ModelInputs:
    name = config.get("name", "?")
    specs = []
    for entry in config.get("input", []):
        data_type = entry.get("data_type", "")
        if data_type not in TRITON_TO_NUMPY:
            raise ModelInputError(f"model {name!r} input {entry.get('name')!r} has type {data_type!r}; "
                                  f"generated inputs support {', '.join(sorted(TRITON_TO_NUMPY))}")
        specs.append(InputSpec(entry["name"], data_type, tuple(int(d) for d in entry.get("dims", []))))
    if not specs:
        raise ModelInputError(f"model {name!r} declares no inputs")
    params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
    max_length = int(params.get("max_sequence_length") or DEFAULT_MAX_LENGTH)
    return ModelInputs(name, tuple(specs), int(config.get("max_batch_size", 0)), max_length)


def fetch_model_inputs(http_url: str, model: str, timeout: float = 5.0) -> ModelInputs:
    url = f"http://{http_url}/v2/models/{model}/config"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse_model_inputs(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        raise ModelInputError(f"model {model!r} is not served at {http_url} ({exc.code}: "
                              f"{exc.read().decode(errors='replace')[:200]})") from None


def write_perf_input_data(path: Path, model_inputs: ModelInputs, lengths: LengthDistribution, count: int,
                          seed: int = 0) -> Tuple[Path, List[int]]:
    """perf_analyzer --input-data JSON of `count` variable-shape requests; returns the path and the lengths."""
    rng = np.random.default_rng(seed)
    feeds = model_inputs.requests(rng, count, lengths)
    samples = []
    drawn = []
    for feed in feeds:
        # perf_analyzer adds the batch dimension itself (-b 1).
        samples.append({k: (v[0] if model_inputs.max_batch_size > 0 else v) for k, v in feed.items()})
        variable = [s for s in model_inputs.inputs if -1 in s.dims]
        drawn.append(int(feed[variable[0].name].shape[-1]) if variable else 0)
    return write_input_data(path, samples), drawn
