"""A stock Python-backend decoupled text generator, written as python_backend's decoupled
examples are: a thread per request that runs the model's programs one token at a time and
sends each output through the request's response sender. It runs the same TorchScript
programs and the same text helpers (text.py, beside this file) as the latte streaming model
it is measured against, and speaks the same interface (Triton's vLLM backend's).
"""

import json
import os
import threading

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

import text


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = os.path.join(args["model_repository"], args["model_version"])
        torch.set_num_threads(int(params.get("intra_op_threads", "1")))
        self.kind = params["kind"]
        self.context = int(params.get("context", "0"))
        self.max_tokens = int(params.get("max_tokens", "16"))
        self.prefill = torch.jit.load(os.path.join(folder, "prefill.pt")).eval()
        self.decode = torch.jit.load(os.path.join(folder, "decode.pt")).eval()
        self.threads = []
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self.generate, args=(request,), daemon=True)
            thread.start()
            with self.lock:
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return None

    def read(self, request):
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        stream = pb_utils.get_input_tensor_by_name(request, "stream")
        stream = bool(stream.as_numpy().reshape(-1)[0]) if stream is not None else False
        sampling = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        if sampling is not None:
            parameters = json.loads(sampling.as_numpy().reshape(-1)[0])
        else:
            parameters = json.loads(request.parameters() or "{}")
        return prompt, stream, int(parameters.get("max_tokens", self.max_tokens)), bool(parameters.get("ignore_eos"))

    def generate(self, request):
        sender = request.get_response_sender()
        try:
            prompt, stream, max_tokens, ignore_eos = self.read(request)
            ids = torch.from_numpy(text.encode(prompt))
            pieces = []
            with torch.inference_mode():
                token, state = self.prefill(ids[None], torch.tensor([[len(ids)]]))
                length = len(ids)
                while True:
                    if int(token) == 0 and not ignore_eos:
                        break
                    piece = text.decode(int(token))
                    pieces.append(piece)
                    full = self.kind == "gpt" and length >= self.context
                    last = len(pieces) >= max_tokens or full
                    if stream:
                        sender.send(self.response(piece), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                                    if last else 0)
                        if last:
                            return
                    elif last:
                        break
                    if self.kind == "gpt":
                        # The cache grows in blocks, as the latte model's does: the decoder writes
                        # the new row into the room past the length.
                        if length == state.shape[1]:
                            state = torch.cat([state, torch.zeros_like(state[:, :16])], dim=1)
                        token, _ = self.decode(token, state, torch.tensor([[length]]))
                        length += 1
                    else:
                        token, state = self.decode(token, state)
            if stream:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                whole = (prompt if isinstance(prompt, bytes) else prompt.encode()) + b"".join(pieces)
                sender.send(self.response(whole), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def response(piece):
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([piece], dtype=object))])

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=5)
