"""The example networks. The bundled three are small on purpose: they build in seconds on
2 cores. `Ranker` is production-sized (about 97 MB of weights) for the serving benchmark."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Tabular features -> class logits."""

    def __init__(self, features: int = 16, hidden: int = 64, classes: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """3x32x32 images -> 10 class logits."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).mean(dim=(2, 3)))


class SequenceEncoder(nn.Module):
    """Token ids of any length (0 = padding) -> one pooled embedding per sequence.

    Padding is masked out of attention and of the pooling, so a sequence padded to a
    longer batch gives the same output as the sequence alone.
    """

    def __init__(self, vocab: int = 1000, width: int = 32, max_len: int = 128) -> None:
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.position = nn.Embedding(max_len, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.norm1 = nn.LayerNorm(width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        valid = tokens != 0                                        # [B, L]
        # From the tokens, not torch.arange: a trace would keep arange's device as a constant and
        # the TorchScript model would then run on the CPU only.
        positions = torch.cumsum(torch.ones_like(tokens), dim=1) - 1
        h = self.embed(tokens) + self.position(positions)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(1, 2)) / (self.width ** 0.5)
        # -1e4, not -1e9: the fill must fit in fp16 (max 65504) for the half-precision variant;
        # exp(-1e4) is 0 in every precision, so padding still gets no weight.
        scores = scores.masked_fill(~valid.unsqueeze(1), -1e4)
        h = self.norm1(h + self.proj(torch.matmul(torch.softmax(scores, dim=-1), v)))
        h = self.norm2(h + self.ff(h))
        weights = valid.unsqueeze(-1).to(h.dtype)
        return (h * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class Ranker(nn.Module):
    """A user's item history (ids of any length, 0 = padding) -> scores for 16 candidates.

    The shape of a recommendation ranker: an embedding bag (masked mean) feeding a wide
    MLP tower. At one row per call the tower is a matrix-vector product bound by memory
    bandwidth, so batching rows into one call is what makes it fast; padding is masked out
    of the pooling, so a padded history scores the same as the history alone.
    """

    def __init__(self, vocab: int = 50_000, width: int = 64, hidden: int = 4096, candidates: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.tower = nn.Sequential(
            nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden // 4), nn.ReLU(), nn.Linear(hidden // 4, candidates),
        )

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        valid = (history != 0).unsqueeze(-1).to(torch.float32)     # [B, L, 1]
        pooled = (self.embed(history) * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)
        return self.tower(pooled)


class TopicHead(nn.Module):
    """A pooled text embedding -> 4 topic logits: the second head of the branching example
    pipeline, next to normalize, both reading the encoder's output."""

    def __init__(self, width: int = 32, hidden: int = 64, topics: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, topics))

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.net(embedding)
