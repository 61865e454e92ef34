"""Small and full prefill passes on CUDA with their layers' token-wise parts replayed from captured graphs.

A pass of ~1,700 tokens (a 5-row statement's) costs the device ~22 ms and the
host ~50 ms to queue: two compiled-region calls a layer, each a few GEMM and
Triton launches behind dynamo's and AOT autograd's wrappers. A full pass costs
the device more than the host, but only while the host has the interpreter to
itself: with other statements planning and tokenizing on the server's threads,
the device waited within it (bench/GPU_NOTES.md). Here every layer's part
before attention (norm, q/k/v projection, q/k norms, rotary) and after it
(output projection, residual, norm, MLP) is a graph captured per size bucket:
a pass of n tokens is padded to the next of SIZES, or, when it holds several
queries' rows, to the token budget when it fills at least FULL of it; its
tokens' rows go first in static buffers, and each part is one replay, whose
last kernels store q, k, v and the hidden states in the buffers themselves
(`Decoder.qkv_into`, `finish_into`: no copy after them; on a shared full pass
of Qwen3-4B such copies were ~5% of its device time, see bench/GPU_NOTES.md).
Attention and the KV writes stay as they are, between the replays, over the
first n rows (attention by one Triton call writes its output into the buffer
the part after it reads); so do the last layer's part after attention, at the
rows' last positions only. Any other pass runs the compiled regions directly:
padding it would cost the device more than the host saves, and one query's
full pass mostly has the host to itself (replayed, it pays for copying its
embeddings into the buffers, and for its padding; even the 0.6B embedding
shape's full pass, 28 light layers, gained nothing on an H100: 33.9 ms
replayed against 32.3 directly, then, with the q/k heads written into the
buffers, 1% of a speed run, within the spread of hosts; bench/GPU_NOTES.md).
Padding rows start from
zeros and are read by nothing. A pass may run inside another, between two of
its layers, while `aside` keeps what the other holds in the buffers. Graphs
share one memory pool: each writes only the static buffers, so nothing of one
outlives it there, and any may replay after any other. They are captured at
warm-up (`prepare`), never in a query's pass, and replayed by one thread at a
time (the device's owner loop: the buffers are the graphs' own). Models with
fp8 layers run every pass directly (`serves`): the GPU test does not cover
their captured passes yet.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from quail.engine.kernels.fp8 import Fp8Linear
from quail.engine.model.decoder import Decoder

SIZES = (128, 256, 512, 1024, 2048)  # the token counts a small captured pass is padded to
FULL = 0.98  # the share of the token budget from which a pass is full: padded to the budget
LARGEST_FULL = 32768  # the largest budget whose full passes are captured (their buffers and activations)


def bucket(n: int, full: int | None = None) -> int | None:
    """The size a pass of n tokens is padded to: the next of SIZES, or the token budget `full` (where its
    passes are captured) for a pass of at least FULL of it; None for any other.

    >>> bucket(1), bucket(129), bucket(2048), bucket(2049)
    (128, 256, 2048, None)
    >>> bucket(16100, 16384), bucket(16384, 16384), bucket(15000, 16384), bucket(16385, 16384)
    (16384, 16384, None, None)
    """
    small = next((size for size in SIZES if size >= n), None)
    if small is None and full is not None and FULL * full <= n <= full:
        return full
    return small


class PassGraphs:
    """Captured token-wise parts of one model's layers, per size bucket (CUDA).

    `parts` gives what a pass
    of n tokens runs them with (Decoder.forward's `parts`). `token_budget`: the passes' budget, whose
    full passes are captured too when it is past SIZES and at most LARGEST_FULL."""

    @staticmethod
    def serves(model: Decoder) -> bool:
        """Whether the model's passes replay from graphs: on CUDA, without fp8 layers."""
        return model.embed_tokens.weight.is_cuda and not any(isinstance(m, Fp8Linear) for m in model.modules())

    def __init__(self, model: Decoder, token_budget: int | None = None) -> None:
        self.model = model
        self.full = token_budget if token_budget is not None and SIZES[-1] < token_budget <= LARGEST_FULL else None
        self.sizes = SIZES + ((self.full,) if self.full is not None else ())
        self.memory = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[list[torch.cuda.CUDAGraph], ...]] = {}  # size: each layer's before, after
        cfg, weight = model.config, model.embed_tokens.weight
        rows, kinds = self.sizes[-1], dict(device=weight.device, dtype=weight.dtype)
        self.x = torch.zeros(rows, cfg.hidden_size, **kinds)
        self.cos, self.sin = torch.zeros(rows, cfg.head_dim, **kinds), torch.zeros(rows, cfg.head_dim, **kinds)
        self.q, self.attn = (torch.zeros(rows, cfg.num_heads, cfg.head_dim, **kinds) for _ in range(2))
        self.k, self.v = (torch.zeros(rows, cfg.num_kv_heads, cfg.head_dim, **kinds) for _ in range(2))

    def prepare(self) -> None:
        """Capture every size's graphs (a server's warm-up)."""
        for size in self.sizes:
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)

    def parts(self, n: int, shared: bool = False) -> "CapturedParts | None":
        """What runs a pass of n tokens (`shared`: holding several queries' rows): its size's graphs, a full
        size only for a shared pass; None for a pass of no size (`bucket`), or before `prepare`."""
        size = bucket(n, self.full if shared else None)
        return CapturedParts(self, n, size) if size in self.graphs else None

    def _capture(self, size: int) -> tuple[list[torch.cuda.CUDAGraph], ...]:
        """Each layer's part before attention, and each but the last one's after it, over the first `size`
        rows of the buffers: run on a side stream first (the compiled regions built for the size outside
        the capture), then captured."""
        model, x, cos, sin = self.model, self.x[:size], self.cos[:size], self.sin[:size]
        q, k, v, attn = self.q[:size], self.k[:size], self.v[:size], self.attn[:size]
        layers = range(len(model.layers))

        def before(layer: int) -> None:
            model.qkv_into(layer, x, cos, sin, (q, k, v))

        def after(layer: int) -> None:
            model.finish_into(layer, x, attn)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for layer in layers:
                before(layer)
                after(layer)
            x.zero_()
        torch.cuda.current_stream().wait_stream(side)
        return ([self._captured(before, layer) for layer in layers],
                [self._captured(after, layer) for layer in layers[:-1]])

    def _captured(self, part: Callable[[int], None], layer: int) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self.memory):
            part(layer)
        return graph


class CapturedParts:
    """A pass of n tokens through its size's captured graphs.

    A pass of n tokens through its size's graphs (decoder.LayerParts): the tokens' rows first in the
    buffers, the padding rows of the hidden states zeros. Each part reads the buffers, which hold what
    the arguments name (the views `embedded` and `finish` return, and attention's output copied in)."""

    def __init__(self, graphs: PassGraphs, n: int, size: int) -> None:
        self.graphs, self.n, self.size = graphs, n, size

    def embedded(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        g, n = self.graphs, self.n
        for buffer, value in zip((g.x, g.cos, g.sin), g.model.embedded(ids, positions)):
            buffer[:n].copy_(value)
        g.x[n:self.size].zero_()
        return g.x[:n], g.cos[:n], g.sin[:n]

    @contextmanager
    def aside(self) -> Iterator[None]:
        """What this pass holds in the buffers between its layer's q/k/v and its attention (the hidden states
        and their padding rows, the rotary tables, q, k, v), kept while another pass runs through them (one
        cut into this pass, scheduler.PassScheduler), and put back."""
        g, n = self.graphs, self.n
        held = [g.x[:self.size]] + [buffer[:n] for buffer in (g.cos, g.sin, g.q, g.k, g.v)]
        kept = [buffer.clone() for buffer in held]
        yield
        for buffer, copy in zip(held, kept):
            buffer.copy_(copy)

    def qkv(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        g, n = self.graphs, self.n
        g.graphs[self.size][0][layer].replay()
        return g.q[:n], g.k[:n], g.v[:n]

    def attention_out(self) -> torch.Tensor:
        """The buffer the part after attention reads: attention writing there spares `finish` a copy."""
        return self.graphs.attn[:self.n]

    def finish(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        g, n = self.graphs, self.n
        if attn.data_ptr() != g.attn.data_ptr():  # attention wrote elsewhere (not in one Triton call)
            g.attn[:n].copy_(attn)
        g.graphs[self.size][1][layer].replay()
        return g.x[:n]
