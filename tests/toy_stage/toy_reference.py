"""Reference of the toy stage that proves a stage needs no pipeline change."""

import torch
from torch import nn


def scale_rows(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha * x / ||x||_row. x: (..., d)."""
    return alpha * x / x.norm(dim=-1, keepdim=True)


class Gate(nn.Module):
    """sigmoid(w_g x) * w_v x, with sub-modules w_g, w_v (both d -> d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w_g = nn.Linear(d, d)
        self.w_v = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.w_g(x)) * self.w_v(x)
