"""The models of the distributed proof, shared by the in-process (fake process group) tests and the
ranks that tests/dist_worker.py runs under torchrun.

A 4-layer transformer whose counts are known in closed form: d=256, 4 heads, pre-norm
blocks ``x + attn(ln1(x))``, ``x + mlp(ln2(x))`` with ``attn`` = one fused ``qkv`` Linear(d, 3d) and
``proj`` Linear(d, d) around ``scaled_dot_product_attention``, ``mlp`` = fc1 Linear(d, 4d), GELU,
fc2 Linear(4d, d), and a final LayerNorm; no embedding. Per block:
  attention 3d*d + 3d + d*d + d = 4*65536 + 1024            = 263,168
  MLP       d*4d + 4d + 4d*d + d = 2*262144 + 1024 + 256     = 525,568
  2 LayerNorms 2*2*256                                        =   1,024
  block                                                       = 789,760
  4 blocks + final LayerNorm (512)   4*789,760 + 512          = 3,159,552 params
MACs on a local batch 2x64 (128 tokens):
  qkv + proj 4*d*d*128 = 33,554,432; scores and weighted sum 2 * 2*4*64*64*64 = 4,194,304;
  MLP 2*d*4d*128 = 67,108,864; block 104,857,600; 4 blocks  = 419,430,400 MACs
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, LAYERS, BATCH, SEQ = 256, 4, 4, 2, 64


class Attention(nn.Module):
    def __init__(self, d: int = D, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, d: int = D, layers: int = LAYERS) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def ddp(model: nn.Module | None = None) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model if model is not None else Transformer())


def fsdp() -> nn.Module:
    from modelprof.runtime.compat import fully_shard

    model = Transformer()
    for layer in model.layers:
        fully_shard(layer)
    return fully_shard(model)


def tensor_parallel(local_output: bool = True, device: str = "cpu") -> nn.Module:
    """Megatron-style MLP: fc1 column-wise, fc2 row-wise (its output all-reduced). With
    ``local_output=False`` the activation between them stays a DTensor (GELU runs on it)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = Transformer() if device == "cpu" else Transformer().to(device)
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for layer in model.layers:
        parallelize_module(
            layer.mlp,
            mesh,
            {"fc1": ColwiseParallel(use_local_output=local_output), "fc2": RowwiseParallel()},
        )
    return model
