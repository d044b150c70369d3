import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A fused chain: matrix multiply (no bias), add a bias vector, GELU (exact, erf form)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x) + self.bias)


batch = 128
in_features, out_features = 512, 1024


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features]
