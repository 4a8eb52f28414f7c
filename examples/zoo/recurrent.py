"""Zoo sequence taggers: a bidirectional LSTM over token ids and a two-layer GRU over feature vectors with
per-row lengths (a packed sequence), each tagging every position of a sequence whose length is dynamic."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class LstmTagger(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 16, hidden: int = 16, tags: int = 5) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.tags = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embedding(tokens))
        scores: torch.Tensor = self.tags(states)
        return scores


class GruTagger(nn.Module):
    """``lengths`` (batch x 1) says how many of each row's frames are real: the GRU reads only those (packed),
    and the padding positions come out as the tag layer's bias."""

    def __init__(self, features: int = 8, hidden: int = 16, tags: int = 5) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.tags = nn.Linear(hidden, tags)

    def forward(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(frames, lengths.squeeze(1).cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.gru(packed)
        padded, _ = pad_packed_sequence(states, batch_first=True, total_length=frames.size(1))
        scores: torch.Tensor = self.tags(padded)
        return scores
