import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.softmax_forward(x)
