import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x * scale + shift) * 0.5 over 1M floats (the cuda task's 4M, a quarter:
    judged in about half the time on a laptop's cores): four memory-bound passes in eager, one when fused."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return torch.relu(x * self.scale + self.shift) * 0.5


N = 1 << 20


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return [2.0, 0.1]
