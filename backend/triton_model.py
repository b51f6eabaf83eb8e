"""What `model.py` delegates to: load once, then turn requests into responses."""

from __future__ import annotations

from typing import List

from latte.backend import autocomplete
from latte.backend.config import parse_args, parse_model_config
from latte.backend.engine import BatchEngine
from latte.backend.requests import RequestError, RequestReader
from latte.backend.responses import ResponseBuilder
from latte.backend.runtimes import load_runtime


def instance_device(args) -> str:
    if str(args.get("model_instance_kind", "CPU")).upper() == "GPU":
        return f"cuda:{int(args.get('model_instance_device_id', 0))}"
    return "cpu"


class LatteModel:
    def __init__(self, args, pb) -> None:
        self.pb = pb
        config, model_dir, version = parse_args(args)
        self.spec = parse_model_config(config, model_dir, version, device=instance_device(args))
        self.runtime = load_runtime(
            self.spec.runtime, self.spec.model_path,
            [t.name for t in self.spec.inputs], [t.name for t in self.spec.outputs],
            self.spec.intra_op_threads, self.spec.inter_op_threads, self.spec.device,
        )
        self.reader = RequestReader(self.spec)
        self.engine = BatchEngine(self.spec, self.runtime)
        self.responses = ResponseBuilder(pb, [t.name for t in self.spec.outputs])
        pb.Logger.log_info(
            f"latte: {self.spec.name} ready ({self.spec.runtime}, {self.spec.model_path.name}, "
            f"max_batch_size={self.spec.max_batch_size}, intra_op_threads={self.spec.intra_op_threads})"
        )

    @staticmethod
    def auto_complete_config(auto_complete_model_config, pb):
        additions = autocomplete.complete(auto_complete_model_config.as_dict(), autocomplete.stub_version_dir())
        autocomplete.apply(auto_complete_model_config, additions)
        return auto_complete_model_config

    def execute(self, requests) -> List:
        parsed = []
        for request in requests:
            try:
                parsed.append(self.reader.read(request))
            except RequestError as exc:
                parsed.append(exc)
            except Exception as exc:  # a reader bug must still answer this request alone
                parsed.append(RequestError(f"could not read request: {type(exc).__name__}: {exc}"))
        outcomes = self.engine.infer(parsed)
        return [self.responses.build(outcome) for outcome in outcomes]

    def finalize(self) -> None:
        self.runtime.close()
