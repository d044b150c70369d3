import torch.nn as nn

import cuda_extension

THREADS = {threads}  # threads per block (ignored on the cpu backend)


class ModelNew(nn.Module):
    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return cuda_extension.affine_relu_forward(x, self.scale, self.shift, THREADS)
