"""The two example streaming models, greedy and seeded, built here (no downloads):

- a recurrent decoder (a GRU cell): its state is one hidden vector per stream, a fixed size;
- a GPT-2-shaped transformer (token and position embeddings, pre-norm blocks of causal
  self-attention and a GELU MLP, a tied head): its state is the key/value cache, one row per
  token, which grows.

Each comes as the two programs a streaming model is made of (docs/streaming.md), saved as
TorchScript:
- *start* (prefill): a batch of prompts, padded, with each one's length -> the first token and
  the state (the GRU's hidden vector; the transformer's cache rows, one per prompt token);
- *step* (decode): each live stream's last token and state -> its next token and next state
  (the new hidden vector; one new cache row, read against the cache padded to the longest).

Tokens are characters: 0 ends a text, 1..95 are the printable ASCII characters.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 96           # 0: the end token; 1..95: chr(31 + id)
END_TOKEN = 0
# The end token's logit is lowered by this much: seeded random weights would otherwise end
# many texts after a handful of characters.
END_BIAS = -4.0


class GruPrefill(nn.Module):
    def __init__(self, embed: nn.Embedding, cell: nn.GRUCell, head: nn.Linear) -> None:
        super().__init__()
        self.embed, self.cell, self.head = embed, cell, head

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        batch, width = ids.shape
        hidden = torch.zeros(batch, self.cell.hidden_size)
        lengths = lengths.reshape(-1)
        for t in range(width):
            stepped = self.cell(self.embed(ids[:, t]), hidden)
            hidden = torch.where((t < lengths).unsqueeze(1), stepped, hidden)
        return _greedy(self.head(hidden)), hidden


class GruDecode(nn.Module):
    def __init__(self, embed: nn.Embedding, cell: nn.GRUCell, head: nn.Linear) -> None:
        super().__init__()
        self.embed, self.cell, self.head = embed, cell, head

    def forward(self, token: torch.Tensor, hidden: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        hidden = self.cell(self.embed(token.reshape(-1)), hidden)
        return _greedy(self.head(hidden)), hidden


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    bias = torch.zeros(logits.shape[-1])
    bias[0] = -4.0  # END_BIAS (TorchScript reads no module constants)
    return torch.argmax(logits + bias, dim=-1, keepdim=True)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def split(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, W] -> q, k, v, each [B, T, heads, head_dim]."""
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(batch, length, 3, self.heads, self.head_dim).unbind(2)
        return q, k, v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """attended [B, T, heads, head_dim]: the residual stream after the block."""
        x = x + self.proj(attended.flatten(2))
        return x + self.mlp(self.ln2(x))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """q [B, Tq, H, D], k and v [B, Tk, H, D], allowed [B, Tq, Tk] -> [B, Tq, H, D]."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)


class GptPrefill(nn.Module):
    """ids [B, T], lengths [B, 1] -> token [B, 1], cache [B, T, layers, 2, heads, head_dim]."""

    def __init__(self, gpt: "TinyGpt") -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        gpt = self.gpt
        batch, width = ids.shape
        positions = torch.arange(width)
        x = gpt.tok(ids) + gpt.pos(positions).unsqueeze(0)
        causal = positions.unsqueeze(0) <= positions.unsqueeze(1)          # [T, T]: key <= query
        real = positions.unsqueeze(0) < lengths.reshape(-1, 1)             # [B, T]
        allowed = causal.unsqueeze(0) & real.unsqueeze(1)
        rows = []
        for block in gpt.blocks:
            q, k, v = block.split(x)
            rows.append(torch.stack([k, v], dim=2))                        # [B, T, 2, H, D]
            x = block.finish(x, _attend(q, k, v, allowed))
        last = (lengths.reshape(-1) - 1).clamp(min=0)
        final = x[torch.arange(batch), last]
        return _greedy(gpt.logits(final)), torch.stack(rows, dim=2)


class GptDecode(nn.Module):
    """token [B, 1], cache [B, T, layers, 2, heads, head_dim] (past each stream's length, with
    room for one more row), cache_lengths [B, 1] -> next token [B, 1], the new token's cache
    row [B, layers, 2, heads, head_dim]. The new row is written into the gathered cache at each
    stream's length (a copy the caller made for this call), so attention reads one tensor."""

    def __init__(self, gpt: "TinyGpt") -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, token: torch.Tensor, cache: torch.Tensor, cache_lengths: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        gpt = self.gpt
        lengths = cache_lengths.reshape(-1)
        batch, width = cache.shape[0], cache.shape[1]
        position = lengths.clamp(max=gpt.pos.num_embeddings - 1)
        x = (gpt.tok(token.reshape(-1)) + gpt.pos(position)).unsqueeze(1)  # [B, 1, W]
        rows = torch.arange(batch)
        # The past up to each stream's length, and the new token at it.
        allowed = (torch.arange(width).unsqueeze(0) <= lengths.unsqueeze(1)).reshape(batch, 1, 1, width)
        made = []
        for index, block in enumerate(gpt.blocks):
            q, k, v = block.split(x)
            row = torch.stack([k[:, 0], v[:, 0]], dim=1)                   # [B, 2, H, D]
            made.append(row)
            cache[rows, lengths, index] = row
            keys = cache[:, :, index, 0].transpose(1, 2)                  # [B, H, T, D]
            values = cache[:, :, index, 1].transpose(1, 2)
            attended = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=allowed)
            x = block.finish(x, attended.transpose(1, 2))
        return _greedy(gpt.logits(x[:, 0])), torch.stack(made, dim=1)


class TinyGpt(nn.Module):
    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2, context: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.context, self.layers, self.heads, self.head_dim = context, layers, heads, width // heads

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x) @ self.tok.weight.t()


def gpt_programs(seed: int = 0, width: int = 64, heads: int = 4, layers: int = 2, context: int = 256):
    """(prefill, decode, cache row dims) of a seeded transformer, as TorchScript."""
    torch.manual_seed(seed)
    gpt = TinyGpt(width, heads, layers, context).eval()
    with torch.no_grad():  # GPT-2's initialisation scale: the embeddings carry the signal
        for parameter in gpt.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    return (torch.jit.script(GptPrefill(gpt)), torch.jit.script(GptDecode(gpt)),
            [layers, 2, heads, width // heads])


def gru_programs(seed: int = 0, hidden: int = 128):
    """(prefill, decode, hidden size) of a seeded recurrent decoder, as TorchScript."""
    torch.manual_seed(seed)
    embed, cell = nn.Embedding(VOCAB, 32), nn.GRUCell(32, hidden)
    head = nn.Linear(hidden, VOCAB)
    with torch.no_grad():
        for parameter in (*embed.parameters(), *cell.parameters(), *head.parameters()):
            parameter.normal_(0.0, 0.5)
    return torch.jit.script(GruPrefill(embed, cell, head).eval()), torch.jit.script(GruDecode(embed, cell, head).eval()), hidden
