"""NeuMF (GMF + MLP, He et al. 2017, NVIDIA's sizes and initialisation) in PyTorch, free of
parallelism; the job is ``hvd_bert.jobs.ncf``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["NeuMF", "ncf_loss"]


class NeuMF(nn.Module):
    """``forward(users, items)`` -> logits ``[B]``. Initialisation as NVIDIA's NCF: embeddings
    N(0, 0.01), MLP layers Glorot-uniform, the final layer LeCun-uniform."""

    def __init__(self, n_users: int, n_items: int, factors: int = 64,
                 layers: tuple[int, ...] = (256, 256, 128, 64), dropout: float = 0.0):
        super().__init__()
        half = layers[0] // 2
        self.mf_user, self.mf_item = nn.Embedding(n_users, factors), nn.Embedding(n_items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(n_users, half), nn.Embedding(n_items, half)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(layers[:-1], layers[1:]))
        self.dropout = dropout
        self.final = nn.Linear(factors + layers[-1], 1)
        for e in (self.mf_user, self.mf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(e.weight, 0.0, 0.01)
        for lin in self.mlp:
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
        bound = (3.0 / self.final.in_features) ** 0.5
        nn.init.uniform_(self.final.weight, -bound, bound)
        nn.init.zeros_(self.final.bias)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.mf_user(users) * self.mf_item(items)
        x = torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1)
        for lin in self.mlp:
            x = F.relu(lin(x))
            if self.dropout and self.training:
                x = F.dropout(x, self.dropout)
        return self.final(torch.cat([gmf, x], dim=-1)).squeeze(-1)


def ncf_loss(model: NeuMF, batch: dict) -> torch.Tensor:
    logits = model(batch["users"], batch["items"])
    return F.binary_cross_entropy_with_logits(logits.float(), batch["labels"])
