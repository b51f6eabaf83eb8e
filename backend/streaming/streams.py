"""One stream: a decoupled request from its arrival until its final response, and what each of
its outputs turns into (sent now, kept for the one response at the end, or the end)."""

from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from latte.backend.dtypes import is_string
from latte.backend.streaming.controls import StreamControls

_numbers = itertools.count(1)

Outputs = Dict[str, np.ndarray]  # one stream's outputs of one iteration, without the batch dimension


def _constant(values, dtype) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False  # shared by every response that carries it
    return array


_REASONS = {reason: _constant([b"None" if reason is None else reason.encode()], object)
            for reason in (None, "stop", "length")}
_ONE_TOKEN = _constant([1], np.uint32)
_EMPTY_TEXT = _constant([b""], object)


class Stream:
    """`inputs`: the request's inputs the start graph reads (each without a batch dimension);
    `sender`: where its responses go (the stub's response sender; anything with send());
    `text`: the string output stop strings are matched in, and the prompt is put before."""

    __slots__ = ("number", "inputs", "controls", "arrival", "deadline", "sender", "request", "text", "prompt",
                 "slot", "blocks", "length", "produced", "pieces", "said", "cancelled", "check_at", "ended",
                 "sent_at")

    def __init__(self, inputs: Dict[str, np.ndarray], controls: StreamControls, arrival: float, sender=None,
                 request=None, text: Optional[str] = None, prompt: bytes = b"") -> None:
        self.number = next(_numbers)
        self.inputs = inputs
        self.controls = controls
        self.arrival = arrival
        timeout = controls.options.timeout_ms
        self.deadline = float("inf") if timeout is None else arrival + timeout / 1000.0
        self.sender = sender
        self.request = request
        self.text = text
        self.prompt = prompt
        self.slot: Optional[int] = None    # its row of the fixed-size state
        self.blocks: List[int] = []        # its cache blocks, in order
        self.length = 0                    # its cache rows
        self.produced = 0                  # outputs so far
        self.pieces: List[Outputs] = []    # outputs kept for a response that is not streamed
        self.said = b""                    # the text so far, where stop strings are looked for
        # Set where its client is found gone, or to the error that ends it where its response
        # could not be sent.
        self.cancelled: Union[bool, Exception] = False
        self.check_at = arrival            # when the loop next asks whether its client gave up
        self.ended = False
        self.sent_at: Optional[float] = None  # when its last output was sent (its sender's clock)

    @property
    def priority(self) -> int:
        return self.controls.options.priority

    def __repr__(self) -> str:
        return f"Stream({self.number}, produced={self.produced}, length={self.length})"

    def take(self, outputs: Optional[Outputs], ended_by: Optional[str] = None
             ) -> Optional[Tuple[Optional[Outputs], bool]]:
        """What to send for this iteration's `outputs` (None: the end token came, nothing to
        add); `ended_by` when the model ends the stream here ("stop": its own end; "length": its
        context is full): (outputs or None, final), or None when nothing goes out yet (a
        response that is not streamed waits for the end). The reason it ends is told as vLLM
        tells it: a stop condition (the end token, a stop string, the model's end) before a
        length (max_tokens, the context)."""
        reason = "stop" if outputs is None else None
        if outputs is not None:
            self.produced += 1
            if self.controls.stop and self.text is not None:
                outputs, stopped = self._before_stop(outputs)
                if stopped:
                    reason = "stop"
            if reason is None and ended_by != "stop" and self.produced >= self.controls.max_tokens:
                reason = "length"
            reason = reason or ended_by
        final = reason is not None
        if self.controls.stream:
            if outputs is not None and self.controls.additional:
                outputs = self._with_additional(outputs, reason, 1)
            return outputs, final
        if outputs is not None:
            self.pieces.append(outputs)
        if not final:
            return None
        whole = self._whole()
        if self.controls.additional:  # the end token is a token the model made, as vLLM counts it
            whole = self._with_additional(whole, reason, len(self.pieces) + (outputs is None))
        return whole, True

    def closing(self) -> Optional[Outputs]:
        """What a streamed stream that ended on its end token sends with its final flag: nothing
        (None), or, where its request asked for additional outputs, those and the empty text,
        as vLLM's last response after its end token (which that token adds to the count). Made
        by the sender, not with the iteration's outputs: the response carries no output of the
        model, so it is not counted or timed as one."""
        if not self.controls.additional:
            return None
        outputs = {}
        if self.text is not None:
            outputs[self.text] = _EMPTY_TEXT
        return self._with_additional(outputs, "stop", 1)

    def _with_additional(self, outputs: Outputs, reason: Optional[str], tokens: int) -> Outputs:
        """The outputs and the additional ones the request asked for (controls.py)."""
        outputs = dict(outputs)
        for name in self.controls.additional:
            if name == "finish_reason":
                outputs[name] = _REASONS[reason]
            else:  # num_output_tokens: what this response adds
                outputs[name] = _ONE_TOKEN if tokens == 1 else np.array([tokens], dtype=np.uint32)
        return outputs

    def _before_stop(self, outputs: Outputs) -> Tuple[Outputs, bool]:
        """The outputs cut where a stop string begins, and whether one did."""
        piece = outputs[self.text].reshape(-1)[0]
        before = len(self.said)
        self.said += piece
        window = max(len(s) for s in self.controls.stop)
        start = max(0, before - window + 1)
        hits = [i for i in (self.said.find(s, start) for s in self.controls.stop) if i >= 0]
        if not hits:
            return outputs, False
        cut = min(hits)
        self.said = self.said[:cut]
        kept = np.empty_like(outputs[self.text])
        kept.reshape(-1)[0] = piece[:max(0, cut - before)]
        return {**outputs, self.text: kept}, True

    def _whole(self) -> Outputs:
        """Every output kept, joined: strings into one, the rest along their first dimension."""
        if not self.pieces:  # the end token came first: the prompt alone, or nothing
            if self.text is None:
                return {}
            text = np.empty(1, dtype=object)
            text[0] = self.prompt if self.controls.prepend_input else b""
            return {self.text: text}
        joined = {}
        for name, first in self.pieces[0].items():
            parts = [piece[name] for piece in self.pieces]
            if is_string(first.dtype):
                text = b"".join(bytes(p.reshape(-1)[0]) for p in parts)
                if self.controls.prepend_input and name == self.text:
                    text = self.prompt + text
                array = np.empty(first.shape, dtype=object)
                array.reshape(-1)[0] = text
                joined[name] = array
            else:
                joined[name] = np.concatenate(parts)
        return joined
