"""The illustrator's network and sampler in torch: the reference `samples/illustrator/*.loom`
mirrors, op for op (the parity test runs both on the same weights and noise).

A fully convolutional UNet over RGB in [-1, 1]:

    conv_in 3->32                                   (H x W)
    down0  Res(32->32)      -> skip0, conv 3x3 stride 2   (H/2)
    down1  Res(32->64)      -> skip1, conv 3x3 stride 2   (H/4)
    layout the text's 16 x 16 x 16 map (below), resized to H/4 x W/4, concatenated: 80 channels
    mid    Res(80->128), self-attention (4 heads), Res(128->128)
    up1    nearest x2, concat skip1, Res(192->64)          (H/2)
    up0    nearest x2, concat skip0, Res(96->32)           (H)
    out    GroupNorm, SiLU, conv 3x3 32->3

Res(ci->co): GN(8) SiLU conv3x3 -> GN(8) * (1 + scale) + shift -> SiLU conv3x3, plus the input
(through a 1x1 conv when ci != co). scale/shift per block come from the conditioning vector
c = SiLU(time_mlp(sinusoid(t)) + text_proj(text)), where text is the prompt's 384-d
all-MiniLM-L6-v2 vector (zeros = unconditional). The text also draws a coarse layout:
SiLU(layout1(text)) -> layout2 -> a [16, 16, 16] map (channels, rows, columns), nearest-resized
to the quarter-resolution grid and concatenated to the features there: a per-prompt spatial
template, which FiLM's per-channel scales alone learn slowly. H and W must be multiples of 4
(16 is what the source asks, to keep attention small).

Training objective: rectified flow (flow matching): x_t = (1 - t) x0 + t e, the net predicts
v = e - x0. Sampling: Euler from t = 1 to 0 in `steps` equal steps with classifier-free
guidance v = v_u + w (v_c - v_u).

LoRA: every Res conv3x3 carries optional low-rank adapters: delta = B(A(x)) * scale, with A a
conv3x3 ci->rank and B a 1x1 rank->co; several adapters add, each with its own scale per row.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

TEXT_DIM = 384
TIME_FREQS = 32
COND = 128
GROUPS = 8
HEADS = 4
RANK = 4
LAYOUT_HIDDEN = 256
LAYOUT_CHANNELS = 16
LAYOUT_SIDE = 16


def sinusoid(t: torch.Tensor) -> torch.Tensor:
    """[B] in [0, 1] -> [B, 2 * TIME_FREQS]: sin then cos of 1000 t f_i, f_i = 10000^(-i/F)."""
    f = torch.exp(-math.log(10000.0) * torch.arange(TIME_FREQS, dtype=torch.float32) / TIME_FREQS)
    a = 1000.0 * t[:, None] * f[None]
    return torch.cat([torch.sin(a), torch.cos(a)], dim=1)


class LoraConv(nn.Module):
    """conv3x3 with adapters: y = conv(x) + sum_a scale[b, a] * B_a(A_a(x))."""

    def __init__(self, ci: int, co: int):
        super().__init__()
        self.conv = nn.Conv2d(ci, co, 3, padding=1)
        self.adapters = nn.ModuleDict()
        self.ci, self.co = ci, co

    def add_adapter(self, name: str) -> None:
        a = nn.Conv2d(self.ci, RANK, 3, padding=1, bias=False)
        b = nn.Conv2d(RANK, self.co, 1, bias=False)
        nn.init.zeros_(b.weight)
        self.adapters[name] = nn.Sequential(a, b)

    def forward(self, x: torch.Tensor, scales: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        y = self.conv(x)
        for name, s in (scales or {}).items():
            y = y + s[:, None, None, None] * self.adapters[name](x)
        return y


class Res(nn.Module):
    def __init__(self, ci: int, co: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, ci)
        self.conv1 = LoraConv(ci, co)
        self.film = nn.Linear(COND, 2 * co)
        self.norm2 = nn.GroupNorm(GROUPS, co)
        self.conv2 = LoraConv(co, co)
        self.skip = nn.Conv2d(ci, co, 1) if ci != co else None

    def forward(self, x, c, scales=None):
        h = self.conv1(F.silu(self.norm1(x)), scales)
        scale, shift = self.film(c).chunk(2, dim=1)
        h = self.norm2(h) * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
        h = self.conv2(F.silu(h), scales)
        return h + (x if self.skip is None else self.skip(x))


class Attention(nn.Module):
    """Pre-norm multi-head self-attention over the H x W tokens, residual."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.out = nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        b, ch, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, HEADS, ch // HEADS, h * w).unbind(1)
        att = torch.softmax(torch.einsum("bhdi,bhdj->bhij", q, k) / math.sqrt(ch // HEADS), dim=-1)
        y = torch.einsum("bhij,bhdj->bhdi", att, v).reshape(b, ch, h, w)
        return x + self.out(y)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.time1 = nn.Linear(2 * TIME_FREQS, COND)
        self.time2 = nn.Linear(COND, COND)
        self.text = nn.Linear(TEXT_DIM, COND)
        self.conv_in = nn.Conv2d(3, 32, 3, padding=1)
        self.down0 = Res(32, 32)
        self.pool0 = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.down1 = Res(32, 64)
        self.pool1 = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        self.layout1 = nn.Linear(TEXT_DIM, LAYOUT_HIDDEN)
        self.layout2 = nn.Linear(LAYOUT_HIDDEN, LAYOUT_CHANNELS * LAYOUT_SIDE * LAYOUT_SIDE)
        self.mid0 = Res(64 + LAYOUT_CHANNELS, 128)
        self.attn = Attention(128)
        self.mid1 = Res(128, 128)
        self.up1 = Res(192, 64)
        self.up0 = Res(96, 32)
        self.norm_out = nn.GroupNorm(GROUPS, 32)
        self.conv_out = nn.Conv2d(32, 3, 3, padding=1)

    def blocks(self) -> list[Res]:
        return [self.down0, self.down1, self.mid0, self.mid1, self.up1, self.up0]

    def add_adapter(self, name: str) -> None:
        for r in self.blocks():
            r.conv1.add_adapter(name)
            r.conv2.add_adapter(name)

    def forward(self, x, t, text, scales=None):
        c = F.silu(self.time2(F.silu(self.time1(sinusoid(t)))) + self.text(text))
        h = self.conv_in(x)
        s0 = self.down0(h, c, scales)
        h = self.pool0(s0)
        s1 = self.down1(h, c, scales)
        h = self.pool1(s1)
        layout = self.layout2(F.silu(self.layout1(text))).reshape(-1, LAYOUT_CHANNELS, LAYOUT_SIDE, LAYOUT_SIDE)
        h = torch.cat([h, F.interpolate(layout, size=h.shape[2:], mode="nearest")], 1)
        h = self.mid1(self.attn(self.mid0(h, c, scales)), c, scales)
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = self.up1(torch.cat([h, s1], 1), c, scales)
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = self.up0(torch.cat([h, s0], 1), c, scales)
        return self.conv_out(F.silu(self.norm_out(h)))


@torch.no_grad()
def sample(net: UNet, text: torch.Tensor, noise: torch.Tensor, steps: int = 20, guidance: float = 3.0,
           scales: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Euler rectified-flow sampler with classifier-free guidance; noise [B, 3, H, W] -> images
    [B, 3, H, W] in [-1, 1] (clamped). The conditional and unconditional passes run as one batch."""
    b = text.shape[0]
    x = noise
    both_text = torch.cat([text, torch.zeros_like(text)])
    both_scales = None if scales is None else {k: torch.cat([v, v]) for k, v in scales.items()}
    for i in range(steps):
        t = torch.full((2 * b,), 1.0 - i / steps)
        v = net(torch.cat([x, x]), t, both_text, both_scales)
        vc, vu = v[:b], v[b:]
        x = x - (vu + guidance * (vc - vu)) / steps
    return x.clamp(-1.0, 1.0)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] [B, 3, H, W] -> uint8 [B, H, W, 3], rounding half up like the source."""
    return torch.floor((images.permute(0, 2, 3, 1) + 1.0) * 127.5 + 0.5).clamp(0, 255).to(torch.uint8)


def splitmix_noise(seed: int, height: int, width: int, channels: int = 3) -> torch.Tensor:
    """The source's starting noise (std:unet.loom's gaussian_noise), [1, channels, H, W]: element
    j = (y * W + x) * channels + c of an image takes splitmix64 draws number 2j and 2j + 1 of
    the stream seeded with `seed` (std:sampling.loom's generator) and goes through Box-Muller
    in f64: sqrt(-2 ln u1) cos(2 pi u2), u1 = (top 24 bits + 1) / 2^24, u2 = top 24 bits / 2^24."""
    import numpy as np

    n = height * width * channels
    counters = np.arange(2 * n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (counters + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    top = (z >> np.uint64(40)).astype(np.float64)
    u1, u2 = (top[0::2] + 1.0) * 2.0 ** -24, top[1::2] * 2.0 ** -24
    x = (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)
    return torch.from_numpy(x.reshape(1, height, width, channels)).permute(0, 3, 1, 2).contiguous()
