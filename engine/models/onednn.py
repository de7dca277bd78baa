"""Linear layers through oneDNN with weights packed once, for float32 on the CPU.

On this class of machine (AVX2, no AMX) torch's default CPU matmul (MKL sgemm) runs the model's
skinny shapes ([1..64 tokens] x [576 -> 3072] and the [576 -> 49152] LM head) 1.3-2x slower than
oneDNN with a prepacked weight; `python -m engine.bench` measures both. Results agree to float32
rounding (a different summation order), not bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn


class OneDNNLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().to_mkldnn()  # [out, in], oneDNN's blocked layout
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        # The op Inductor uses for frozen CPU linears: dense in, dense out, no layout conversions.
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


def pack_linears(module: nn.Module) -> None:
    """Replace every nn.Linear inside `module` with a OneDNNLinear, in place."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, OneDNNLinear(child))
        else:
            pack_linears(child)
