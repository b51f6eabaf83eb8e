"""The model config of a streaming model, from its stream.json (docs/streaming.md).

A streaming model's inputs are what its start graph reads, plus the controls Triton's vLLM
backend takes (stream, sampling_parameters, exclude_input_in_output, and the flags of the
additional outputs latte makes: return_finish_reason, return_num_output_tokens), so that its
clients work unchanged. Its outputs are what both graphs write and the stream does not keep
(each response carries them), and finish_reason and num_output_tokens (a response carries each
where its request asked). Every output is [-1]: a response that is not streamed joins them.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Mapping

from latte.backend.streaming.controls import ADDITIONAL_OUTPUTS, CONTROL_INPUTS, CONTROL_TYPES, check_not_written
from latte.backend.streaming.definition import StreamDefinition, load_stream


def stream_outputs(definition: StreamDefinition) -> Dict[str, str]:
    """Output name -> data type: what the start and step graphs both write, beyond the state and cache."""
    kept = set(definition.state) | set(definition.state.values())
    if definition.cache is not None:
        kept |= {definition.cache.name, definition.cache.row}
    if definition.done is not None:
        kept.add(definition.done)
    step = {t.name: t.data_type for t in definition.step.outputs}
    return {t.name: t.data_type for t in definition.start.outputs
            if t.name in step and t.name not in kept and step[t.name] == t.data_type}


def stream_context(name: str, definition: StreamDefinition, parameters: Mapping[str, object]) -> Dict:
    """The config context (config.pbtxt.j2) of a decoupled latte model serving `definition`."""
    inputs = [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims)} for t in definition.start.inputs]
    declared = {t["name"] for t in inputs}
    inputs += [{"name": control, "data_type": CONTROL_TYPES[control], "dims": [1], "optional": True}
               for control in CONTROL_INPUTS if control not in declared]
    outputs = [{"name": output, "data_type": data_type, "dims": [-1]}
               for output, data_type in stream_outputs(definition).items()]
    if not outputs:
        raise ValueError(f"{definition.path}: the start and step graphs write no output in common beyond the "
                         "state and cache, so a stream would have nothing to send")
    check_not_written(name, (t.name for graph in (definition.start, definition.step) for t in graph.outputs))
    outputs += [{"name": output, "data_type": data_type, "dims": [-1]}
                for output, data_type in ADDITIONAL_OUTPUTS.values()]
    return {
        "name": name, "backend": "latte", "max_batch_size": 0, "decoupled": True,
        "inputs": inputs, "outputs": outputs, "dynamic_batching": None,
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {key: str(value) for key, value in parameters.items()},
    }


def version_files(stream_file: Path) -> Dict[str, Path]:
    """What a streaming model's version folder holds: everything beside its stream.json (the
    graphs and their step folders)."""
    folder = Path(stream_file).parent
    return {entry.name: entry for entry in sorted(folder.iterdir()) if not entry.name.startswith(".")}


@contextmanager
def scratch_model(stream_file: Path, parameters: Mapping[str, object]) -> Iterator[Path]:
    """A model folder in a temporary directory serving `stream_file`, with `parameters`: what
    profiling loads in this process."""
    from latte.generator.model_folder import write_model

    definition = load_stream(Path(stream_file))
    with tempfile.TemporaryDirectory(prefix="latte-stream-") as tmp:
        context = stream_context("profiled", definition, parameters)
        yield write_model(Path(tmp), context, version_files(stream_file))

