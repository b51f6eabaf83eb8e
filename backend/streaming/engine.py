"""One iteration's work on the live streams: the start graph on the streams that join, the
step graph on every stream already running, each as one batch; their state kept in the pools
(blocks.py) between iterations. It answers with emissions, (stream, outcome, final), and calls
nothing back: the runner decides who joins, the model sends.

Each batch runs through a BatchRunner (batch_runner.py), which records it as a served model's
batches are; a batch that fails follows the one rule for failed batches (batch_runner.isolated):
it is run again stream by stream, so only the streams the model fails on end (with an error
naming the step), and the others go on.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from latte.backend.batching import Batch
from latte.backend.dtypes import to_numpy
from latte.backend.batch_runner import BatchRunner, isolated, out_of_memory, request_failure
from latte.backend.errors import OutOfMemory
from latte.backend.streaming.blocks import BlockPool, ShortOfBlocks, StatePool
from latte.backend.streaming.definition import StreamDefinition
from latte.backend.streaming.invariance import PROBE_MOST_ROWS, PROBE_ROWS, fewest_invariant_rows, probe_feed
from latte.backend.streaming.options import StreamOptions
from latte.backend.streaming.streams import Outputs, Stream

Outcome = Union[Outputs, Exception, None]
Emission = Tuple[Stream, Outcome, bool]   # what to send a stream, and whether it is its last


class StreamEngine:
    def __init__(self, name: str, definition: StreamDefinition, start_graph, step_graph, options: StreamOptions,
                 outputs: Sequence[str]) -> None:
        self.name = name
        self.definition = definition
        self.start_graph, self.step_graph = start_graph, step_graph
        self.starts, self.steps = BatchRunner(start_graph), BatchRunner(step_graph)
        self.output_names = list(outputs)
        made = {t.name: t for t in definition.start.outputs}
        self.state = StatePool(options.max_streams, {s: (made[s].dims, to_numpy(made[s].data_type))
                                                     for s in definition.state})
        cache = definition.cache
        self.cache = None if cache is None else BlockPool(options.cache_blocks, cache.block_tokens, cache.row_dims,
                                                          to_numpy(cache.data_type))
        self._start_inputs = definition.start_inputs
        self._end_tokens = frozenset(definition.end_tokens) if definition.token is not None else frozenset()
        self.live: List[Stream] = []
        # A batch of fewer rows is padded up to it with copies of its first row, so that a
        # stream's outputs do not depend on how many streams share its batch (invariance.py).
        self.min_rows = 1

    # -- joining ------------------------------------------------------------------------
    def start(self, streams: Sequence[Stream]) -> List[Emission]:
        """The start graph on the joining streams, as one batch: each gets its state and first output."""
        try:
            outputs, lengths = self._run(self.starts, self._start_batch(streams))
        except Exception as exc:
            return isolated(self.name, exc, streams, self._start_alone, self._ended_with)
        emissions = []
        for i, stream in enumerate(streams):
            try:  # what one stream's rows hold fails that stream alone
                self._hold(stream, outputs, lengths, i)
                self.live.append(stream)
                emissions.extend(self._emit(stream, outputs, i))
            except Exception as exc:
                emissions.append(self._failed(stream, exc))
        return emissions

    def _start_alone(self, stream: Stream) -> List[Emission]:
        return self.start([stream])

    def _run(self, runner: BatchRunner, batch: Batch):
        """The batch run and recorded (its padding rows counted among its members); a failure
        of the model's is recorded as a failed batch, and raised."""
        started = runner.clock()
        try:
            return runner.run(batch, started)
        except Exception as exc:
            if out_of_memory(self.name, exc) is None:
                runner.record_failed(batch, len(batch.member_rows), started)
            raise

    def _start_batch(self, streams: Sequence[Stream]) -> Batch:
        rows = [{name: stream.inputs[name][None] for name in self._start_inputs} for stream in streams]
        return self.start_graph.batch_of(rows + rows[:1] * (self.min_rows - len(rows)))

    def measure_invariant_rows(self, most_rows: int) -> int:
        """The fewest rows a step batch needs for each row to be computed alike however many
        share it, up to `most_rows` (invariance.py), measured on made-up state. The start graph
        is assumed to agree (its inputs cannot be made up), and so is the cache's width."""
        tensors = {name: (array.shape[1:], array.dtype) for name, array in self.state.arrays.items()}
        cache = self.definition.cache
        if cache is not None:
            tensors[cache.name] = ((self.cache.block_rows, *self.cache.array.shape[2:]), self.cache.array.dtype)
        probe_rows = max(PROBE_ROWS, min(most_rows, PROBE_MOST_ROWS))
        feed = probe_feed(tensors, probe_rows)
        if cache is not None:
            # Rows already held, so attention reads some: a fully masked cache would hide a
            # difference there. One row of the block stays free for the new token's.
            rows_held = np.random.default_rng(1).integers(1, max(self.cache.block_rows, 2), size=(probe_rows, 1))
            feed[cache.lengths] = np.minimum(rows_held, self.cache.block_rows - 1).astype(np.int64)

        def run(rows: int):  # each run its own copy: a step may write into its cache input
            inputs = {name: array[:rows].copy() for name, array in feed.items()}
            return self.step_graph.run_batch(Batch(inputs=inputs, member_rows=[1] * rows, rows=rows))[0]

        try:
            return fewest_invariant_rows(run, probe_rows)
        finally:
            self.step_graph.forget_batches()

    def _hold(self, stream: Stream, outputs, lengths, i: int) -> None:
        """The stream's state slot and cache blocks, filled with what start made."""
        stream.slot = self.state.take()  # given back by `drop`, should a row not fit
        self.state.write_row(stream.slot, {name: outputs[name][i] for name in self.state.arrays},
                             self.definition.start.path.name)
        cache = self.definition.cache
        if cache is None:
            return
        rows = outputs[cache.name][i]
        own = lengths.get(cache.name) if lengths else None
        count = int(own[i]) if own is not None else rows.shape[0]
        # The running streams whose last block is full take one at their next step: a prompt
        # leaves them that many, so that joining never makes a running stream run short.
        kept = sum(1 for s in self.live if s.length == len(s.blocks) * self.cache.block_rows)
        needed = self.cache.blocks_for(max(count, 1))
        try:
            stream.blocks = self.cache.take(needed, kept)
        except ShortOfBlocks as exc:
            if needed > self.cache.capacity:
                raise OutOfMemory(f"the stream's cache does not fit: {exc}; it is refused (the pool holds "
                                  f"cache_blocks={self.cache.capacity})") from None
            raise OutOfMemory(f"the stream's cache is held by the running streams: {exc}; it is refused, retry "
                              f"once some end") from None
        self.cache.write_rows(stream.blocks, rows[:count])
        stream.length = count

    # -- stepping -----------------------------------------------------------------------
    def step(self, streams: Sequence[Stream]) -> List[Emission]:
        """The step graph on `streams` (live, each holding its state), as one batch."""
        emissions: List[Emission] = []
        ready = []
        for stream in streams:
            try:
                self._room(stream)
                ready.append(stream)
            except OutOfMemory as exc:
                emissions.append(self._failed(stream, exc))
        if ready:
            emissions.extend(self._step(ready))
        return emissions

    def _room(self, stream: Stream) -> None:
        """A block for the stream's next cache row when its last block is full."""
        if self.cache is not None and stream.length == len(stream.blocks) * self.cache.block_rows:
            try:
                stream.blocks.extend(self.cache.take(1))
            except ShortOfBlocks as exc:
                raise OutOfMemory(f"the stream cache ran short after {stream.length} tokens: {exc}") from None

    def _step(self, streams: Sequence[Stream]) -> List[Emission]:
        slots = np.fromiter((s.slot for s in streams), dtype=np.int64, count=len(streams))
        try:
            outputs, _ = self._run(self.steps, self._step_batch(streams, slots))
        except Exception as exc:
            return isolated(self.name, exc, streams, self._step_alone, self._ended_with)
        definition, count = self.definition, len(streams)  # rows past count pad the batch
        try:  # state that does not fit leaves every stream of the batch without a consistent state
            self.state.write(slots, {name: outputs[following][:count] for name, following in definition.state.items()},
                             definition.step.path.name)
            cache = definition.cache
            if cache is not None:
                lengths = np.fromiter((s.length for s in streams), dtype=np.int64, count=count)
                size = self.cache.block_rows
                blocks = np.fromiter((s.blocks[s.length // size] for s in streams), dtype=np.int64, count=count)
                self.cache.append(blocks, lengths % size, outputs[cache.row][:count], definition.step.path.name)
                for stream in streams:
                    stream.length += 1
        except Exception as exc:
            return [self._failed(stream, exc) for stream in streams]
        emissions = []
        for i, stream in enumerate(streams):
            try:  # what one stream's rows hold fails that stream alone
                emissions.extend(self._emit(stream, outputs, i, following=True))
            except Exception as exc:
                emissions.append(self._failed(stream, exc))
        return emissions

    def _step_alone(self, stream: Stream) -> List[Emission]:
        return self._step([stream])

    def _step_batch(self, streams: Sequence[Stream], slots: np.ndarray) -> Batch:
        # Padding rows (min_rows) are the first stream's again, picked by the gathers themselves:
        # no second copy of what they gathered.
        rows = max(len(streams), self.min_rows)
        padded = [*streams, *streams[:1] * (rows - len(streams))]
        if rows > len(streams):
            slots = np.concatenate([slots, np.repeat(slots[:1], rows - len(streams))])
        inputs = self.state.gather(slots)
        cache = self.definition.cache
        if cache is not None:
            table = np.zeros((rows, max(len(s.blocks) for s in streams)), dtype=np.int64)
            for row, stream in zip(table, padded):
                row[:len(stream.blocks)] = stream.blocks
            # Whole blocks, past each stream's length (at least the row its next token takes:
            # _room), read with `lengths`; handed on as gathered (one copy, contiguous: nothing
            # trims it again).
            inputs[cache.name] = self.cache.gather(table)
            inputs[cache.lengths] = np.fromiter((s.length for s in padded), dtype=np.int64, count=rows).reshape(-1, 1)
        return Batch(inputs=inputs, member_rows=[1] * rows, rows=rows)

    # -- answering ----------------------------------------------------------------------
    def _emit(self, stream: Stream, outputs, i: int, following: bool = False) -> List[Emission]:
        """What stream i's outputs of this batch send; the stream leaves when that is its last."""
        definition = self.definition
        ended = False
        if self._end_tokens and not stream.controls.ignore_eos:
            token_name = definition.state[definition.token] if following else definition.token
            ended = int(outputs[token_name][i].reshape(-1)[0]) in self._end_tokens
        ended_by = None
        if definition.done is not None and following and outputs[definition.done][i].any():
            ended_by = "stop"
        elif definition.cache is not None and stream.length >= definition.cache.max_tokens:
            ended_by = "length"  # its cache holds no further row: the model's context is full
        mine = None if ended else {name: outputs[name][i] for name in self.output_names}
        taken = stream.take(mine, ended_by)
        if taken is None:
            return []
        outcome, final = taken
        if final:
            self.drop(stream)
        return [(stream, outcome, final)]

    def _failed(self, stream: Stream, exc: BaseException) -> Emission:
        return self._ended_with(stream, request_failure(self.name, exc))

    def _ended_with(self, stream: Stream, failure: Exception) -> Emission:
        """The stream's last emission, the error it is answered with; it leaves."""
        self.drop(stream)
        return stream, failure, True

    def drop(self, stream: Stream) -> None:
        """The stream leaves: its state and cache blocks go back to the pools (idempotent)."""
        if stream.ended:
            return
        stream.ended = True
        if stream.slot is not None:
            self.state.give_back(stream.slot)
            stream.slot = None
        if stream.blocks:
            self.cache.give_back(stream.blocks)
            stream.blocks = []
        try:
            self.live.remove(stream)
        except ValueError:
            pass  # it failed before it joined

    def held(self) -> Dict[str, int]:
        """Blocks and bytes the live streams hold, and the bytes their rows need."""
        figures = {"live": len(self.live), "state_slots": self.state.taken, "cache_blocks": 0, "cache_rows": 0,
                   "held_bytes": self.state.taken * self.state.row_bytes, "needed_bytes": 0}
        figures["needed_bytes"] = figures["held_bytes"]
        if self.cache is not None:
            rows = sum(s.length for s in self.live)
            figures.update(cache_blocks=self.cache.taken, cache_rows=rows, cache_capacity=self.cache.capacity)
            figures["held_bytes"] += self.cache.taken * self.cache.block_bytes
            figures["needed_bytes"] += sum(self.cache.blocks_for(s.length) for s in self.live) * self.cache.block_bytes
        return figures
