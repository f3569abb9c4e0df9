"""placeholder"""
import torch
from .registry import lower
aten = torch.ops.aten
