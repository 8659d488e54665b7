"""Train the scout vision projector (issue 21), LLaVA stage-1 style: DINOv2 and SmolLM2
frozen, only the projector learns, next-token loss on the caption tokens only.

Per step: one pooling for the whole batch, alternating 64 positions (2 x 2 pooling, `auto` /
`high`) and 16 positions (4 x 4, `low`); samples drawn from the training renderings by a seeded
permutation (epochs in order). Each sample's sequence is the prompt layout of common.py; the
constant prefix (system turn + "<|im_start|>user\\n") is run once and its keys/values reused
(it does not depend on the image, so the loss is the same as running it each time). The batch
is right-padded (causal attention, so padding after a sequence's end never reaches it; padded
positions carry no loss). Matmuls under bf16 autocast (AMX) for speed; the projector's weights
and the optimiser stay f32.

Usage: python train.py [--steps N] [--batch B] [--lr LR]
Writes projector.safetensors, loss.csv, loss.png next to this file.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DynamicCache

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from build_data import load_split  # noqa: E402
from common import END, POSITIONS, PREFIX, PROMPT, SUFFIX_AFTER_PROMPT, Projector, ids, load_lm, pool8  # noqa: E402
from features import CACHE  # noqa: E402

# Prompts the captions are trained under; the evaluation prompt is half of all samples.
PROMPTS = [PROMPT] * 5 + ["What is this?", "Describe the image briefly.", "What does this picture show?",
                          "Name the object in the image.", "What is in this image?"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--align-steps", type=int, default=600)
    ap.add_argument("--minutes", type=float, default=35.0, help="wall-clock budget of the LM stage")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--bf16", type=int, default=0)
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--resume", default="", help="continue from these projector weights (no align stage), "
                    "appending to loss.csv; a fresh lr warm-up/decay cycle")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count())))

    split = load_split()
    train = split["train"]
    feats = torch.from_numpy(np.load(CACHE / "train.npy"))  # [N, 64, 384]
    assert len(feats) == len(train)
    tok, lm = load_lm()
    embed = lm.get_input_embeddings()
    prefix = torch.tensor([ids(tok, PREFIX)])
    with torch.no_grad():
        pre = lm(input_ids=prefix, use_cache=True).past_key_values
    pre_kv = [(layer.keys, layer.values) for layer in pre.layers]
    n_pre = prefix.shape[1]
    suffix_ids = {p: ids(tok, p + SUFFIX_AFTER_PROMPT) for p in set(PROMPTS)}
    target_ids = [ids(tok, e["caption"] + END) for e in train]

    proj = Projector(args.hidden)
    step0 = 0
    if args.resume:
        from safetensors.torch import load_file
        proj.load_state_dict({k.removeprefix("projector."): v for k, v in load_file(args.resume).items()})
        rows = list(csv.DictReader(open(Path(args.out) / "loss.csv")))
        step0 = 1 + max(int(r["step"]) for r in rows if r["stage"] == "lm")
        rng.seed(args.seed + step0)
        log = open(Path(args.out) / "loss.csv", "a", newline="")
        w = csv.writer(log)
    else:
        log = open(Path(args.out) / "loss.csv", "w", newline="")
        w = csv.writer(log)
        w.writerow(["stage", "step", "positions", "loss", "lr", "seconds"])
        t0 = time.time()
        align(proj, feats, train, tok, embed, args, w)
        print(f"align stage: {time.time() - t0:.0f}s", flush=True)

    opt = torch.optim.AdamW(proj.parameters(), lr=args.lr, weight_decay=0.0)
    budget = args.minutes * 60
    t0 = time.time()
    # lr: 20 steps of warm-up, then linear decay to 0 over the wall-clock budget
    lr_at = lambda step, el: args.lr * min(1.0, (step + 1) / 20) * max(0.0, 1 - el / budget)
    order: list[int] = []
    ema = None
    step = 0
    while time.time() - t0 < budget:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, time.time() - t0)
        k = 2 if step % 2 == 0 else 4
        P = POSITIONS[k]
        if len(order) < args.batch:
            perm = list(range(len(train)))
            rng.shuffle(perm)
            order += perm
        idx, order = order[:args.batch], order[args.batch:]
        img = proj(pool8(feats[idx], k))  # [B, P, 576]
        seqs, labels = [], []
        for b, i in enumerate(idx):
            s = suffix_ids[rng.choice(PROMPTS)]
            t = target_ids[i]
            ids_b = s + t
            seqs.append(ids_b)
            # label positions: the hidden state at position j predicts token j+1
            labels.append((len(s) - 1, t))
        L = max(len(s) for s in seqs)
        tok_ids = torch.full((len(idx), L), tok.pad_token_id or 0, dtype=torch.long)
        for b, s in enumerate(seqs):
            tok_ids[b, :len(s)] = torch.tensor(s)
        x = torch.cat([img, embed(tok_ids)], dim=1)  # [B, P + L, 576]
        cache = DynamicCache()
        for li, (kk, vv) in enumerate(pre_kv):
            cache.update(kk.expand(len(idx), -1, -1, -1), vv.expand(len(idx), -1, -1, -1), li)
        pos = torch.arange(n_pre, n_pre + x.shape[1]).unsqueeze(0).expand(len(idx), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.bf16)):  # off by default
            h = lm.model(inputs_embeds=x, past_key_values=cache, position_ids=pos, use_cache=True).last_hidden_state
        hs, tgt = [], []
        for b, (start, t) in enumerate(labels):
            hs.append(h[b, P + start:P + start + len(t)])
            tgt.append(torch.tensor(t))
        logits = lm.lm_head(torch.cat(hs).float())
        loss = torch.nn.functional.cross_entropy(logits, torch.cat(tgt))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(proj.parameters(), 1.0)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        el = time.time() - t0
        w.writerow(["lm", step0 + step, P, f"{loss.item():.4f}", f"{lr:.3e}", f"{el:.1f}"])
        log.flush()
        if step % 5 == 0:
            print(f"step {step} P={P} loss {loss.item():.3f} ema {ema:.3f} {el:.0f}s", flush=True)
        step += 1
        if step % 20 == 0:
            save(proj, Path(args.out) / "projector.safetensors", args, step0 + step)
    save(proj, Path(args.out) / "projector.safetensors", args, step0 + step)
    log.close()
    print(f"done: {step} LM steps ({step * args.batch} samples) in {time.time() - t0:.0f}s, final ema loss {ema:.3f}")


def align(proj, feats, train, tok, embed, args, w) -> None:
    """Stage 1a (no language-model pass, seconds): pull the mean of the projector's outputs
    towards the mean input embedding of the emoji's name tokens (" fox face"): an InfoNCE over
    all training names on cosine similarity (temperature 0.05) plus an MSE to the matching
    name's mean embedding (sets the scale). A cheap warm start for the LM stage."""
    names = sorted({e["caption"][e["caption"].index(" ") + 1:-1] for e in train})
    col = {n: i for i, n in enumerate(names)}
    with torch.no_grad():
        tgt = torch.stack([embed(torch.tensor(ids(tok, " " + n))).mean(0) for n in names])  # [C, 576]
    label = torch.tensor([col[e["caption"][e["caption"].index(" ") + 1:-1]] for e in train])
    tn = torch.nn.functional.normalize(tgt, dim=-1)
    opt = torch.optim.AdamW(proj.parameters(), lr=1e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    for step in range(args.align_steps):
        lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * step / args.align_steps))
        for pg in opt.param_groups:
            pg["lr"] = lr
        k = 2 if step % 2 == 0 else 4
        idx = torch.randint(0, len(train), (32,), generator=g)
        m = proj(pool8(feats[idx], k)).mean(1)  # [32, 576]
        logits = torch.nn.functional.normalize(m, dim=-1) @ tn.T / 0.05
        loss = torch.nn.functional.cross_entropy(logits, label[idx]) + \
            100.0 * torch.nn.functional.mse_loss(m, tgt[label[idx]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.align_steps - 1:
            acc = (logits.argmax(-1) == label[idx]).float().mean().item()
            w.writerow(["align", step, POSITIONS[k], f"{loss.item():.4f}", f"{lr:.3e}", ""])
            print(f"align {step} loss {loss.item():.3f} batch acc {acc:.2f}", flush=True)


def save(proj: Projector, path: Path, args, steps: int) -> None:
    sd = {f"projector.{k}": v.detach().contiguous().float() for k, v in proj.state_dict().items()}
    meta = {"format": "scout vision projector (issue 21)", "steps": str(steps), "batch": str(args.batch),
            "lr": str(args.lr), "seed": str(args.seed), "hidden": str(args.hidden),
            "activation": "gelu (erf)", "pooling": "mean over k x k blocks of the 16x16 DINOv2 patch grid; "
            "k=4 -> 16 positions (low), k=2 -> 64 positions (auto/high); row-major"}
    save_file(sd, str(path), metadata=meta)


if __name__ == "__main__":
    main()
