"""The Llama-family decoder (Llama, Qwen2, Qwen3): prefill of packed rows, and decode steps of one token per sequence."""

from __future__ import annotations

from typing import Callable, Generator, Protocol, TypeVar

import torch
from torch import nn

from quail.engine.kernels.attention import attention, merge
from quail.engine.kernels.pass_rows import Rows
from quail.engine.kernels.fp8 import project
from quail.engine.kernels.paged_decode import paged_decode
from quail.engine.kernels.swiglu import swiglu
from quail.engine.kv.rows import copy_rows
from quail.engine.model.config import ModelConfig

try:  # Triton, with CUDA builds of torch
    from quail.engine.kernels import mlp_triton, norm_triton, rope_triton
except ImportError:
    mlp_triton = norm_triton = rope_triton = None


Result = TypeVar("Result")


def to_end(steps: Generator[object, None, Result]) -> Result:
    """Run a generator to its end, doing nothing between its steps; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape positions.shape + (head_dim,), half-rotation (HF) layout."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (tokens, heads, head_dim) by the tables (tokens, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def joined_linear(module: nn.Module, name: str, inputs: int, parts: dict[str, int], bias: bool = False) -> None:
    """Give `module` one linear layer `name` whose output is the outputs of `parts` (HF names → widths) side by
    side: one GEMM instead of several. State dicts still load and save under the parts' names."""
    setattr(module, name, nn.Linear(inputs, sum(parts.values()), bias=bias))
    widths = list(parts.values())

    def join(_module, state: dict, prefix: str, *_args) -> None:
        for kind in ("weight", "bias"):
            keys = [f"{prefix}{part}.{kind}" for part in parts]
            if all(key in state for key in keys):
                state[f"{prefix}{name}.{kind}"] = torch.cat([state.pop(key) for key in keys])

    def split(_module, state: dict, prefix: str, _metadata) -> None:
        for key in [key for key in state if key.startswith(f"{prefix}{name}.")]:
            joined, kind = state.pop(key), key.rsplit(".", 1)[1]
            axis = 0 if joined.shape[0] == sum(widths) else -1  # fp8 weight scales are (1, outputs)
            for part, piece in zip(parts, joined.split(widths, dim=axis)):
                state[f"{prefix}{part}.{kind}"] = piece

    module.register_load_state_dict_pre_hook(join)
    module.register_state_dict_post_hook(split)


class Attention(nn.Module):
    """Grouped-query attention projections, optionally with per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.widths = [cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd]
        joined_linear(self, "qkv_proj", cfg.hidden_size, dict(zip(("q_proj", "k_proj", "v_proj"), self.widths)),
                      bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
        """Packed tokens (tokens, hidden) → rotated q (tokens, heads, d), k and v (tokens, kv_heads, d), written
        into `out` (q, k, v buffers) where given.

        - v: a view of the joined q/k/v projection's output (copied into out's).
        - Qwen3's q/k norms and the rotation of both: one Triton pass over the joined output on CUDA in
          bf16/fp16 (rope_triton, writing into out's q and k itself), torch elsewhere.
        """
        t, hd = x.shape[0], self.cfg.head_dim
        joined = self.qkv_proj(x)
        q, k, v = (part.view(t, -1, hd) for part in joined.split(self.widths, dim=-1))
        written = 0
        if self.cfg.qk_norm and _rope_kernel_serves(joined, hd):
            q, k = rope_triton.norm_rope(joined, q.shape[1], k.shape[1], self.q_norm.weight, self.k_norm.weight,
                                         self.q_norm.eps, cos, sin, None if out is None else (out[0], out[1]))
            written = 2  # into out's q and k, where given
        else:
            if self.cfg.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if out is None:
            return q, k, v
        for buffer, part in list(zip(out, (q, k, v)))[written:]:
            buffer.copy_(part)
        return out


def _rope_kernel_serves(joined: torch.Tensor, head_dim: int) -> bool:
    """Whether rope_triton takes these q/k heads: on CUDA in bf16/fp16, half a head a power of two."""
    half = head_dim // 2
    return (rope_triton is not None and joined.is_cuda and joined.dtype in (torch.bfloat16, torch.float16)
            and head_dim % 2 == 0 and half & (half - 1) == 0)


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        joined_linear(self, "gate_up_proj", cfg.hidden_size,
                      {"gate_proj": cfg.intermediate_size, "up_proj": cfg.intermediate_size})
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(self.gate_up_proj, self.down_proj, x)


class LayerParts(Protocol):
    """What runs a prefill pass's embedding and the token-wise parts of its layers (the parts around attention).

    - The model itself, or graphs captured for the pass's size.
    - `finish` need not serve the last layer, and may write its result into the x it is given (the caller
      reads only what it returns).
    - `attention_out` names where attention may write its output (None: anywhere)."""

    def embedded(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def qkv(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def finish(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor: ...

    def attention_out(self) -> torch.Tensor | None: ...


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual connections, split around the attention kernel."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def by_kernels(self, like: torch.Tensor) -> bool:
        """Whether this layer's token-wise parts run by our kernels alone, eagerly, for tensors like `like`.

        - On CUDA in bf16/fp16 where Triton is installed, for Qwen3's layout (q/k norms; rope_triton).
        - Plain linear layers (not fp8), the output projections without bias: each residual is then
          added in place by its projection's GEMM (no copy of the hidden states first, as Inductor's
          addmm makes) and the norms are norm_triton's, so nothing is left to compile.
        """
        attn, mlp = self.self_attn, self.mlp
        return (attn.cfg.qk_norm and _rope_kernel_serves(like, attn.cfg.head_dim)  # Triton, CUDA, bf16/fp16
                and all(type(linear) is nn.Linear for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj,
                                                                 mlp.down_proj))
                and attn.o_proj.bias is None and mlp.down_proj.bias is None)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
        """Everything before attention: norm, projections, q/k norm, rotary embedding (into `out` where given)."""
        norm = self.input_layernorm
        normed = norm_triton.rms_norm(x, norm.weight, norm.eps) if self.by_kernels(x) else norm(x)
        return self.self_attn.project(normed, cos, sin, out)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Everything after attention: output projection, residual, norm, MLP, residual.

        - By our kernels (`by_kernels`): the result is written into x, and x is returned.
        - Else: a new tensor; x is left as it is.
        """
        if self.by_kernels(x):
            norm, mlp = self.post_attention_layernorm, self.mlp
            x.addmm_(attn.flatten(1), self.self_attn.o_proj.weight.t())
            product = mlp_triton.silu_mul(mlp.gate_up_proj(norm_triton.rms_norm(x, norm.weight, norm.eps)))
            return x.addmm_(product, mlp.down_proj.weight.t())
        x = x + project(self.self_attn.o_proj, attn.flatten(1))
        return x + self.mlp(self.post_attention_layernorm(x))


def qkv_into(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """DecoderLayer.qkv written into q, k and v: compiled, the last kernel of each stores there itself."""
    DecoderLayer.qkv(layer, x, cos, sin, (q, k, v))


def finish_into(layer: DecoderLayer, x: torch.Tensor, attn: torch.Tensor) -> None:
    """DecoderLayer.finish written back into x: compiled, its last kernel stores there itself (by our kernels,
    finish wrote there already: copying x onto itself does nothing)."""
    x.copy_(DecoderLayer.finish(layer, x, attn))


class Decoder(nn.Module):
    """A causal decoder over packed rows whose head is evaluated only at chosen positions and token ids.

    State dicts follow the HF layout (`embed_tokens`, `layers.N.self_attn.q_proj`,
    ...) without the `model.` prefix, so HF state dicts load after stripping it;
    q, k and v (and gate and up) are held as one joined linear layer each.
    `padded_attention`: rows are padded per length bucket for attention (cuDNN;
    the only layout on the CPU), else attended by flash varlen calls (CUDA, bf16/fp8).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not weight.is_meta:  # nn.Embedding's draw on the meta device imports torch's compiler (~1.5 s)
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._qkv, self._finish, self._merge = DecoderLayer.qkv, DecoderLayer.finish, merge
        self._qkv_into, self._finish_into = qkv_into, finish_into
        self.padded_attention = True

    def compile_layers(self) -> None:
        """Compile the token-wise parts of a layer (one graph for every layer, any token count).

        - Inductor fuses the norms, residual adds and (fp8) the activation quantization into Triton
          kernels around the GEMMs, and the log-sum-exp merge of shared-prefix attention into one kernel;
          the MLP's SiLU·mul (kernels/swiglu.py) and, on CUDA, Qwen3's q/k norms with the rotary embedding
          (kernels/rope_triton.py) run in kernels of our own.
        - Layers that run by our kernels alone (`DecoderLayer.by_kernels`) stay uncompiled: Inductor would
          add back the copy of the hidden states that their in-place residuals spare.
        """
        self._merge = torch.compile(merge, dynamic=True)
        if all(layer.by_kernels(self.embed_tokens.weight) for layer in self.layers):
            return
        self._qkv = torch.compile(DecoderLayer.qkv, dynamic=True)
        self._finish = torch.compile(DecoderLayer.finish, dynamic=True)
        self._qkv_into = torch.compile(qkv_into, dynamic=True)
        self._finish_into = torch.compile(finish_into, dynamic=True)

    def head_weight(self) -> torch.Tensor:
        """The output projection (vocab, hidden), tied to the embeddings where the model says so."""
        return self.embed_tokens.weight if self.config.tie_embeddings else self.lm_head.weight

    def embedded(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tokens' embeddings, and the rotary tables of their positions in the embeddings' dtype."""
        cos, sin = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        x = self.embed_tokens(ids)
        return x, cos.to(x.dtype), sin.to(x.dtype)

    def qkv(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Layer `layer`'s part before attention (DecoderLayer.qkv, compiled where the layers are)."""
        return self._qkv(self.layers[layer], x, cos, sin)

    def finish(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s part after attention (DecoderLayer.finish, compiled where the layers are)."""
        return self._finish(self.layers[layer], x, attn)

    def attention_out(self) -> None:
        """Where attention may write its output: anywhere (LayerParts; a captured pass names its buffer)."""
        return None

    def qkv_into(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 out: tuple[torch.Tensor, ...]) -> None:
        """Layer `layer`'s part before attention written into `out` (q, k, v: a captured graph's buffers)."""
        self._qkv_into(self.layers[layer], x, cos, sin, *out)

    def finish_into(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> None:
        """Layer `layer`'s part after attention written back into x (a captured graph's buffer)."""
        self._finish_into(self.layers[layer], x, attn)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, rows: Rows, last: torch.Tensor,
                keep: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
                parts: LayerParts | None = None) -> torch.Tensor:
        """Prefill packed rows, each after the resident KV `rows` names.

        - ids and positions: (tokens,); last: the packed index of each row's last token. Returns the
          final-normed hidden state there.
        - `keep(layer, k, v)` receives each layer's new keys and values (tokens, kv_heads, head_dim) to store
          (the runner's pool, kv/pool.py).
        - The last layer's output projection and MLP run at those positions only, by the model itself;
          `parts` runs the embedding and the other token-wise parts (default: the model; a pass's captured
          graphs, runtime/pass_graphs.py).
        """
        return to_end(self.layer_by_layer(ids, positions, rows, last, keep, parts))

    def layer_by_layer(self, ids: torch.Tensor, positions: torch.Tensor, rows: Rows, last: torch.Tensor,
                       keep: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
                       parts: LayerParts | None = None) -> Generator[int, None, torch.Tensor]:
        """`forward`, a layer at a time: yields each layer's index once its keys and values went to `keep`,
        before its attention; returns the hidden states.

        - Between two yields the caller may queue other work on the device (another pass: with `parts`'
          buffers set aside, LayerParts.aside).
        """
        parts = self if parts is None else parts
        x, cos, sin = parts.embedded(ids, positions)
        final = len(self.layers) - 1
        for i in range(final + 1):
            q, k, v = parts.qkv(i, x, cos, sin)
            if keep is not None:
                keep(i, k, v)
            yield i
            out = attention(q, k, v, rows, i, self._merge, parts.attention_out())
            if i < final:
                x = parts.finish(i, x, out)
        return self.norm(self.finish(final, x[last], out[last]))  # nothing reads the last layer's other positions

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, table: torch.Tensor,
               lengths: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """One new token per sequence, after that sequence's keys in a pool: its final-normed hidden state.

        ids, positions, slots, lengths: (sequences,); keys and values: the
        pool's tensors per layer (slots, kv_heads, head_dim). Each layer writes
        the new tokens' keys and values at `slots`, then each token attends to
        the first lengths[b] slots of its `table` row (sequences, width), its
        own slot last. No host sync and no shape taken from the values: a
        CUDA graph of one call replays for any tokens, slots and lengths.
        """
        x, cos, sin = self.embedded(ids, positions)
        for i in range(len(self.layers)):
            q, k, v = self.qkv(i, x, cos, sin)
            copy_rows(keys[i], slots, k)
            copy_rows(values[i], slots, v)
            x = self.finish(i, x, paged_decode(q, keys[i], values[i], table, lengths))
        return self.norm(x)

    def label_logits(self, hidden: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """The head cut to label_ids, applied to final hidden states: (batch, n_labels) in fp32."""
        return hidden.float() @ self.head_weight()[label_ids].float().T
