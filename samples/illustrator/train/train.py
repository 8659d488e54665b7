"""Train the illustrator: the base UNet (rectified flow, text-conditioned), then each LoRA.

    python train.py base  --steps 3000            -> ../weights/unet.safetensors, loss.csv
    python train.py lora sketch --steps 400       -> ../weights/lora_sketch.safetensors
    python train.py lora ink --steps 400          -> ../weights/lora_ink.safetensors

Seeds are fixed (torch.manual_seed(SEED + stage)); data comes from data.py's cache. Each
step draws BATCH emoji uniformly, one of their training captions, t ~ U(0, 1) and noise; the
caption vector is replaced by zeros with probability P_UNCOND (classifier-free guidance).
bf16 autocast (oneDNN) on CPU; the weights are kept and saved in f32.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from data import CACHE  # noqa: E402
from model import UNet  # noqa: E402

SEED = 20
BATCH = 64
P_UNCOND = 0.1
WEIGHTS = HERE.parent / "weights"


def load(images: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(np.load(CACHE / images)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x, torch.from_numpy(np.load(CACHE / "captions.npy"))


def train(net: UNet, params, images: str, steps: int, lr: float, log: Path, scales_for=None, resume_step: int = 0,
          checkpoint=None) -> None:
    x0_all, caps = load(images)
    n, k = caps.shape[:2]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, s / steps)))))
    new = not log.exists() or resume_step == 0
    before = 0.0 if new else float(list(csv.reader(log.open()))[-1][2])  # seconds column runs on
    f = log.open("w" if new else "a", newline="")
    w = csv.writer(f)
    if new:
        w.writerow(["step", "loss", "seconds"])
    start = time.time()
    for step in range(steps):
        idx = torch.randint(0, n, (BATCH,))
        text = caps[idx, torch.randint(0, k, (BATCH,))]
        text = text * (torch.rand(BATCH) >= P_UNCOND).float()[:, None]
        x0 = x0_all[idx]
        t = torch.rand(BATCH)
        e = torch.randn_like(x0)
        xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * e
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v = net(xt, t, text, None if scales_for is None else scales_for(BATCH))
        loss = F.mse_loss(v.float(), e - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0:
            w.writerow([resume_step + step, f"{loss.item():.5f}", f"{before + time.time() - start:.1f}"])
            f.flush()
        if checkpoint is not None and step % 500 == 499:
            checkpoint()
        if step % 100 == 0:
            print(f"step {resume_step + step} loss {loss.item():.4f} {time.time() - start:.0f}s", flush=True)
    f.close()


def last_logged_step(log: Path) -> int:
    """The last step a loss log recorded (-10 when there is none), where a resumed run goes on."""
    if not log.exists():
        return -10
    rows = list(csv.reader(log.open()))[1:]
    return int(rows[-1][0]) if rows else -10


def adapter_tensors(net: UNet, style: str) -> dict[str, torch.Tensor]:
    """The adapter's tensors under style-free names (`down0.conv1.lora_a`: the 3x3 down
    projection, `.lora_b`: the 1x1 up projection), what the model document's `loras` load."""
    out = {}
    for k, v in net.state_dict().items():
        if f".adapters.{style}." in k:
            conv, which = k.split(f".adapters.{style}.")
            out[f"{conv}.lora_{'a' if which.startswith('0.') else 'b'}"] = v.contiguous()
    return out


def load_adapter(net: UNet, style: str, tensors: dict[str, torch.Tensor]) -> None:
    """Attach an adapter saved by `adapter_tensors` to `net` (for sampling in torch)."""
    net.add_adapter(style)
    state = {}
    for k, v in tensors.items():
        conv, which = k.rsplit(".lora_", 1)
        state[f"{conv}.adapters.{style}.{0 if which == 'a' else 1}.weight"] = v
    missing = net.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["base", "lora"])
    ap.add_argument("style", nargs="?")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--resume", action="store_true",
                    help="continue the saved base model: a fresh schedule (warm-up, cosine) over --steps, "
                         "a seed of its own, loss.csv appended from its last step")
    args = ap.parse_args()
    WEIGHTS.mkdir(exist_ok=True)
    resume_step = last_logged_step(HERE / "loss.csv") + 10 if args.what == "base" and args.resume else 0
    # A resumed stage draws other batches than the run it continues (seed + its first step).
    torch.manual_seed(SEED + (0 if args.what == "base" else {"sketch": 1, "ink": 2}[args.style]) + resume_step)
    net = UNet()
    if args.what == "base":
        if args.resume:
            net.load_state_dict(load_file(WEIGHTS / "unet.safetensors"))
        save = lambda: save_file({k: v.contiguous() for k, v in net.state_dict().items()}, WEIGHTS / "unet.safetensors")
        train(net, net.parameters(), "images.npy", args.steps, args.lr, HERE / "loss.csv", resume_step=resume_step,
              checkpoint=save)
        save()
    else:
        net.load_state_dict(load_file(WEIGHTS / "unet.safetensors"))
        net.requires_grad_(False)
        net.add_adapter(args.style)
        params = [p for n_, p in net.named_parameters() if ".adapters." in n_]
        for p in params:
            p.requires_grad_(True)
        train(net, params, f"images_{args.style}.npy", args.steps, args.lr, HERE / f"loss_{args.style}.csv",
              scales_for=lambda b: {args.style: torch.ones(b)})
        save_file(adapter_tensors(net, args.style), WEIGHTS / f"lora_{args.style}.safetensors")


if __name__ == "__main__":
    main()
