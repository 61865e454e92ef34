"""The model runner: packed prefill batches, each row after its resident KV and earlier rows of its pass; decode steps."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable, ContextManager, Generator, Sequence

import numpy as np
import torch

from quail.engine.errors import InvalidArgument
from quail.engine.kernels.pass_rows import Rows
from quail.engine.kv.host_tier import HostTier
from quail.engine.kv.pool import KVPool, on_device_all, token_bytes
from quail.engine.kv.resident import ResidentTree
from quail.engine.kv.runs import KV, KVLedger, runs_of
from quail.engine.model.decoder import Decoder, to_end
from quail.engine.runtime.counters import Stats, causal_pairs
from quail.engine.runtime.fed_tokens import feed_from_device
from quail.engine.runtime.pass_events import PassEvents
from quail.engine.runtime.pass_graphs import PassGraphs
from quail.engine.runtime.requests import LabelSet
from quail.engine.runtime.packing import Row
from quail.engine.runtime.step_graphs import MAX_BATCH, StepGraphs


def go_on() -> None:
    """No reason to stop."""


def _keeping(rows: list[Row], starts: list[int], pool: KVPool, ledger: KVLedger
             ) -> tuple[list[KV | None], Callable[[int, torch.Tensor, torch.Tensor], None] | None,
                        tuple[KVPool, np.ndarray] | None]:
    """The KV of each row that keeps tokens (its first `keep`), in slots of the pool (of a pool of the
    pass's own when the pool has too few), the hook that writes each layer's keys and values there, and,
    when every token of the pass is kept, that pool and each packed token's slot (Rows.build's `written`)."""
    counts = [row.keep for row in rows]
    total = sum(counts)
    if not total:
        return [None] * len(rows), None, None
    slots = pool.take(total)
    if slots is None:
        pool = KVPool.like(pool, total)
        slots = pool.take(total)
    runs = runs_of(pool, slots, [count for count in counts if count])
    ledger.keep_each(runs)
    taken = iter(runs)
    kept: list[KV | None] = [next(taken) if count else None for count in counts]
    every = total == starts[-1]  # every token of the pass, in order
    source, target = on_device_all(pool.device, [None if every else np.concatenate(
        [np.arange(start, start + count) for start, count in zip(starts, counts) if count]), slots])

    def write(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if source is not None:
            k, v = k.index_select(0, source), v.index_select(0, source)
        pool.write(layer, target, k, v)

    return kept, write, (pool, slots) if every else None


OPENING_LAYERS = 4  # layers of a pass the host queues on CUDA before the pass's queries count as under way


def opening_layers(device: torch.device) -> int:
    """Layers of a pass the host queues before the pass's queries count as under way: OPENING_LAYERS on
    CUDA, where the device runs the pass behind the host; none on the CPU, where the pass computes on the
    host itself (what waits for it may run beside it from its start)."""
    return OPENING_LAYERS if device.type == "cuda" else 0


def _per_layer(write: Callable[[int, torch.Tensor, torch.Tensor], None] | None, events: PassEvents | None,
               opened: Callable[[], None], opening: int) -> Callable[[int, torch.Tensor, torch.Tensor], None]:
    """The model's per-layer hook: `write` the layer's kept KV, record `events.marked` at layer `events.mark`,
    and call `opened` once the host has queued the pass's first `opening` layers."""

    def hook(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if events is not None and layer == events.mark:
            events.marked.record()
        if layer == opening:
            opened()
        if write is not None:
            write(layer, k, v)

    return hook


Aside = Callable[[], ContextManager[None]]  # sets a pass's buffers aside while another pass runs through them
Passing = Generator[tuple[int, Aside], None, tuple[torch.Tensor, list[KV | None]]]


def kv_pool(model: Decoder, kv_bytes: int) -> KVPool:
    """A pool of as many token slots as `kv_bytes` holds for the model's KV (in its activations' dtype);
    InvalidArgument when the device cannot hold it."""
    cfg, dtype = model.config, model.embed_tokens.weight.dtype
    per_token = token_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype)
    device = next(model.parameters()).device
    refused = InvalidArgument(f"a KV pool of {kv_bytes:,} bytes does not fit in the memory of {device}: lower "
                              f"--kv-cache-bytes")
    if kv_bytes > _memory(device):
        raise refused
    try:
        return KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, device, max(kv_bytes, 0) // per_token)
    except RuntimeError as err:  # torch's out-of-memory errors, on the CPU and on CUDA
        raise refused from err


def host_tier(pool: KVPool, host_bytes: int) -> HostTier | None:
    """Pinned host memory of `host_bytes` for the pool's runs it has no room for (None: 0 bytes);
    InvalidArgument when the machine cannot hold it."""
    if host_bytes <= 0:
        return None
    refused = InvalidArgument(f"a host KV tier of {host_bytes:,} bytes does not fit in this machine's memory: "
                              f"lower --kv-host-bytes")
    if host_bytes > _memory(torch.device("cpu")):
        raise refused
    try:
        return HostTier(pool, host_bytes // pool.bytes_per_token)
    except RuntimeError as err:  # pinning more than the system allows
        raise refused from err


def disk_tier(pool: KVPool, directory: Path, disk_bytes: int) -> HostTier:
    """A file in `directory` of `disk_bytes` for the runs the host tier has no room for; InvalidArgument
    when the directory is missing or cannot hold it."""
    if not directory.is_dir():
        raise InvalidArgument(f"--kv-disk-dir {directory} is not a directory")
    free = shutil.disk_usage(directory).free
    if disk_bytes > free:
        raise InvalidArgument(f"a disk KV tier of {disk_bytes:,} bytes does not fit in {directory} "
                              f"({free:,} bytes free): lower --kv-disk-bytes")
    try:
        return HostTier(pool, disk_bytes // pool.bytes_per_token, directory / f"quail-kv-{os.getpid()}.bin")
    except (OSError, RuntimeError) as err:
        raise InvalidArgument(f"a disk KV tier cannot be made in {directory}: {err}") from err


def _memory(device: torch.device) -> int:
    """Bytes free on a GPU; the machine's memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class ModelRunner:
    """Runs forward passes of a decoder over packed rows and the head cut to label tokens.

    - Runners over one model share its KV `ledger` (what running queries hold), KV `pool` (kv/pool.py;
      default: one of no slots, every pass's kept KV in a pool of its own), resident `tree`
      (kv/resident.py; None: nothing is kept between steps and queries) and, on CUDA, the captured decode
      `steps` (step_graphs.py) and small and full passes' layer parts (`passes`, pass_graphs.py).
    - `check` raises to stop a query before its next pass; `opened` is called once a pass holding its rows
      is under way (see `for_query`).
    - It runs the passes it is given and knows nothing of who fills them (the scheduler, scheduler.py).
    """

    def __init__(self, model: Decoder, token_budget: int = 4096, check: Callable[[], None] = go_on,
                 ledger: KVLedger | None = None, pool: KVPool | None = None, tree: ResidentTree | None = None,
                 steps: StepGraphs | None = None, passes: PassGraphs | None = None,
                 opened: Callable[[], None] = go_on) -> None:
        self.model = model
        self.token_budget = token_budget
        self.device = next(model.parameters()).device
        self.layers = model.config.num_layers
        self.layer_weights = sum(model.config.layer_weights)
        self.padded = model.padded_attention
        self.check = check
        self.opened = opened
        self.ledger = ledger or KVLedger()
        self.pool = pool if pool is not None else kv_pool(model, 0)
        self.tree = tree
        self.steps = steps if steps is not None or self.device.type != "cuda" else StepGraphs(model, self.pool)
        self.passes = (passes if passes is not None or not PassGraphs.serves(model)
                       else PassGraphs(model, token_budget))

    def for_query(self, check: Callable[[], None], opened: Callable[[], None] = go_on) -> "ModelRunner":
        """This runner for one query: same model, budget, ledger, pool, tree and graphs; `check` before each
        pass; `opened` once the host has queued the opening layers of a pass holding the query's rows
        (opening_layers; all of it, for a pass of fewer layers or of decode steps)."""
        return ModelRunner(self.model, self.token_budget, check, self.ledger, self.pool, self.tree, self.steps,
                           self.passes, opened)

    def _inputs(self, rows: list[Row], layout: Rows) -> tuple[torch.Tensor, ...]:
        """Packed token ids, their positions (after what each row continues), each row's last index."""
        starts = np.array(layout.starts)
        ids = np.concatenate([r.ids for r in rows]).astype(np.int64)
        positions = np.arange(starts[-1]) - np.repeat(starts[:-1] - np.array(layout.context), layout.lengths)
        ids_t, positions_t, last = on_device_all(self.device, [ids, positions, starts[1:] - 1])
        feed_from_device(ids_t, rows, layout.starts)
        return ids_t, positions_t, last

    def forward(self, rows: list[Row], stats: Stats) -> tuple[torch.Tensor, list[KV | None]]:
        """Last hidden state of each row, and the KV of rows that asked to keep it: one pass, now, on the
        caller's thread (the scheduler runs the queries' passes; this is for probes and tests)."""
        return self.forward_shared([(rows, stats)], opened=self.opened)

    def pass_events(self, mark: int) -> PassEvents | None:
        """Events for a pass that marks layer `mark`, where the device runs passes behind the host (CUDA);
        None on the CPU, where a pass runs on the caller's thread."""
        return PassEvents(mark) if self.device.type == "cuda" else None

    def forward_shared(self, groups: Sequence[tuple[list[Row], Stats]], events: PassEvents | None = None,
                       opened: Callable[[], None] = go_on) -> tuple[torch.Tensor, list[KV | None]]:
        """`passing`, with nothing run between its layers."""
        return to_end(self.passing(groups, events, opened))

    def passing(self, groups: Sequence[tuple[list[Row], Stats]], events: PassEvents | None = None,
                opened: Callable[[], None] = go_on) -> Passing:
        """One pass over the rows of several owners, in order (a row's parent is its index in the pass),
        queued a layer at a time; returns each row's last hidden state and kept KV.

        - Yields, between two layers, the layer reached and what sets the pass's buffers aside: the points
          where the caller may run a pass of its own (none in a pass of decode steps, one launch).
        - Each owner's work is counted in its stats; `events` are recorded on the way (queued, not waited
          for); `opened` is called once the host has queued the pass's opening layers (opening_layers; at its
          end, for a pass of fewer layers or of decode steps).
        """
        with torch.inference_mode():  # entered once for the pass: a decorator would enter it at every layer
            return (yield from self._layers(groups, events, opened))

    def _layers(self, groups: Sequence[tuple[list[Row], Stats]], events: PassEvents | None,
                opened: Callable[[], None]) -> Passing:
        """`passing`, in the caller's grad mode."""
        rows = [row for owned, _ in groups for row in owned]
        if all(len(r.ids) == 1 and r.slots is not None and r.keep == 1 for r in rows):
            stepped = self._step(groups, rows, events)
            if stepped is not None:
                opened()
                return stepped
        rows = [replace(r, past=KV(((self.pool, r.slots),))) if r.slots is not None and len(r.slots) else r
                for r in rows]
        lengths = [len(r.ids) for r in rows]
        kept, write, written = _keeping(rows, [0, *itertools.accumulate(lengths)], self.pool, self.ledger)
        layout = Rows.build(lengths, [r.past for r in rows], self.device, self.model.padded_attention,
                            [r.parent for r in rows], written)  # the model writes each layer's KV before attention
        ids, positions, last = self._inputs(rows, layout)
        if self.tree is not None:
            self.tree.settle()  # KV the rows continue that is still owed from the host tier
        if events is not None:
            events.start.record()
        shared = sum(1 for owned, _ in groups if owned) > 1
        parts = self.passes.parts(len(ids), shared) if self.passes is not None else None
        opening = opening_layers(self.device)
        aside = parts.aside if parts is not None else contextlib.nullcontext
        layers = self.model.layer_by_layer(ids, positions, layout, last, _per_layer(write, events, opened, opening),
                                           parts)
        while True:
            try:
                layer = next(layers)
            except StopIteration as done:
                hidden = done.value
                break
            yield layer, aside
        if events is not None:
            events.end.record()
        if len(self.model.layers) <= opening:
            opened()
        start = 0
        for owned, stats in groups:
            end = start + len(owned)
            _count(stats, lengths[start:end], layout.context[start:end], owned)
            start = end
        return hidden, kept

    def _step(self, groups: Sequence[tuple[list[Row], Stats]], rows: list[Row], events: PassEvents | None
              ) -> tuple[torch.Tensor, list[KV | None]] | None:
        """A pass of decode steps (rows of one token, each after its `slots` in the pool): each token's KV
        written into a new slot of the pool, attention through a slot table (Decoder.decode; a captured
        graph on CUDA, up to MAX_BATCH rows). None when the pool has no room for the new tokens (the caller's general pass
        keeps them elsewhere)."""
        if self.steps is not None and not self.steps.usable():
            return None
        new = self.pool.take(len(rows))
        if new is None:
            return None
        kept: list[KV | None] = runs_of(self.pool, new, [1] * len(new))  # held from now: freed if the step fails
        self.ledger.keep_each(kept)
        if self.tree is not None:
            self.tree.settle()
        lengths = np.array([len(r.slots) + 1 for r in rows], dtype=np.int64)
        table = np.zeros((len(rows), int(lengths.max())), dtype=np.int32)
        for b, row in enumerate(rows):
            table[b, :len(row.slots)] = row.slots
        table[np.arange(len(rows)), lengths - 1] = new
        ids = np.concatenate([r.ids for r in rows]).astype(np.int64)
        if events is not None:
            events.start.record()
            events.marked.record()  # one launch: the loop may fill the next pass at once
        inputs = (ids, lengths - 1, new, table, lengths)
        if self.steps is not None and len(rows) <= MAX_BATCH:
            hidden = self.steps(*inputs, rows)
        else:  # on the CPU, or past the largest captured step
            ids_t, *rest = (torch.from_numpy(a).to(self.device) for a in inputs)
            feed_from_device(ids_t, rows, range(len(rows)))
            hidden = self.model.decode(ids_t, *rest, self.pool.keys, self.pool.values)
        if events is not None:
            events.end.record()
        for owned, stats in groups:
            _count(stats, [1] * len(owned), [len(r.slots) for r in owned], owned)
        return hidden, kept

    @torch.inference_mode()
    def answer_logprobs(self, hidden: torch.Tensor, labels: LabelSet) -> torch.Tensor:
        """(rows, answers) log-probabilities, renormalised over the label tokens, on the device: computed
        without waiting for it (the label tokens and each answer's members copied without a sync, no
        boolean indexing), so a caller can go on queuing work."""
        members = np.array([[0.0 if group == answer else -np.inf for group in labels.groups]
                            for answer in range(len(labels.names))], dtype=np.float32)
        ids = torch.tensor(labels.token_ids).to(hidden.device, non_blocking=True)
        members_t = torch.from_numpy(members).to(hidden.device, non_blocking=True)
        logp = torch.log_softmax(self.model.label_logits(hidden, ids), dim=-1)
        return torch.logsumexp(logp[:, None, :] + members_t, dim=-1)


def _count(stats: Stats, lengths: list[int], context: list[int], rows: list[Row]) -> None:
    """An owner's rows of a pass in its counters (a pass it has no rows in does not count)."""
    if not rows:
        return
    stats.forward_passes += 1
    stats.fresh_tokens += sum(lengths)
    stats.attention_pairs += sum(causal_pairs(q, c) for q, c in zip(lengths, context))
    stats.kv_read += sum(context)
    stats.kv_written += sum(r.keep for r in rows)
