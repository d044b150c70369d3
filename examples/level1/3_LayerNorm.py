import torch
import torch.nn as nn


class Model(nn.Module):
    """Layer normalisation over the last dimension, with a learned scale and shift."""

    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        with torch.no_grad():  # not the identity: a kernel that skipped them would be wrong
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


features = 2048
tokens = 512


def get_inputs():
    return [torch.randn(tokens, features) * 2 + 1]


def get_init_inputs():
    return [features]
