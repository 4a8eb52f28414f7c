"""Zoo transformers sharing one pre-norm block: a ViT-style patch classifier, a BERT-style encoder on
token ids with a padding mask, and a GPT-style decoder with a causal mask (logits for every position)."""

from __future__ import annotations

import torch
from torch import nn

MASKED = -1e9
"""Given to masked attention scores: finite, so a row with every key masked gives a uniform softmax in eager
PyTorch and in the exported graph alike, instead of NaN."""


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.masked = MASKED  # an attribute, not the global: torch.jit.script cannot read module globals
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """``keep`` (bool, broadcast to batch x heads x queries x keys): which keys each query may attend to."""
        batch, length, dim = x.size(0), x.size(1), x.size(2)
        qkv = self.qkv(x).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (dim // self.heads) ** -0.5
        weights = scores.masked_fill(~keep, self.masked).softmax(dim=-1)
        out: torch.Tensor = self.proj((weights @ v).transpose(1, 2).reshape(batch, length, dim))
        return out


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), keep)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class ViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 8, dim: int = 32, depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads=4) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(tokens.size(0), -1, -1), tokens], dim=1) + self.position
        keep = torch.ones(1, 1, 1, x.size(1), dtype=torch.bool, device=x.device)
        for block in self.blocks:
            x = block(x, keep)
        logits: torch.Tensor = self.head(self.norm(x[:, 0]))
        return logits


class _TokenModel(nn.Module):
    """Token and learned position embeddings, a stack of blocks, a final norm."""

    def __init__(self, vocab: int, dim: int, depth: int, max_length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_length, dim)
        self.blocks = nn.ModuleList(Block(dim, heads=4) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def encode(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.tokens(input_ids) + self.position(positions)
        for block in self.blocks:
            x = block(x, keep)
        out: torch.Tensor = self.norm(x)
        return out


class Bert(_TokenModel):
    """Returns every token's state and a pooled summary of the first token, as BERT does."""

    def __init__(self, vocab: int = 100, dim: int = 32, depth: int = 2, max_length: int = 64) -> None:
        super().__init__(vocab, dim, depth, max_length)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        keep = (attention_mask != 0)[:, None, None, :]
        hidden = self.encode(input_ids, keep)
        return {"hidden": hidden, "pooled": torch.tanh(self.pooler(hidden[:, 0]))}


class Gpt(_TokenModel):
    """Next-token logits for every position; the output projection shares the token embedding's weights."""

    def __init__(self, vocab: int = 100, dim: int = 32, depth: int = 2, max_length: int = 64) -> None:
        super().__init__(vocab, dim, depth, max_length)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
        hidden = self.encode(input_ids, causal[None, None])
        return hidden @ self.tokens.weight.t()
