import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Leaky ReLU, elementwise: x where x > 0, negative_slope * x elsewhere."""

    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, self.negative_slope)


rows, cols = 64, 32768


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [0.05]
