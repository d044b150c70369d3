import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean of each row: with uniform [0, 1) inputs every row mean is 0.5 within 0.001."""

    def forward(self, x):
        return x.mean(dim=1)


B, D = 16, 1 << 16


def get_inputs():
    return [torch.rand(B, D)]


def get_init_inputs():
    return []
