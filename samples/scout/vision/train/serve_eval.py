"""The held-out evaluation of evaluate.py, answered by Loom serving scout instead of torch.

Each held-out rendering (build_data.render, the same code point and seed) is sent as a PNG
data URL in a chat request to a real `loomd` serving samples/scout/model.json (image part
first, then "What is in this image? Answer in a few words.", temperature 0, at most 16
tokens), so the whole serving path runs: decoding, `fit` (a no-op resize at 224 x 224), the
`.loom` encoder and projector, the image positions in the packed prefill, greedy decoding.
The naming rule is evaluate.py's. With `--compare eval_results.md` it also counts how many
answers are word for word the torch answers of evaluate.py.

Usage (the emoji font installed, as for build_data.py):
    python serve_eval.py [--detail auto|low] [--limit N] [--out FILE] [--compare eval_results.md]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(HERE))
from build_data import all_words, load_split, names, render  # noqa: E402

QUESTION = "What is in this image? Answer in a few words."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def ready(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as r:
                regs = json.loads(r.read())["registrations"]
            if regs and all(g["phase"] == "ready" for g in regs):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("loomd did not become ready")


def torch_answers(path: Path) -> dict[tuple[str, int], str]:
    """(set, code point) -> evaluate.py's answer, from its markdown table."""
    out, current = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("### "):
            current = line.split()[1]
        m = re.match(r"\| U\+([0-9A-F]+) \|[^|]*\|[^|]*\| (.*) \| (yes|no) \|$", line)
        if m and current:
            out[(current, int(m.group(1), 16))] = m.group(2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--detail", default="auto", choices=["auto", "low", "high"])
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--out", default="")
    ap.add_argument("--compare", default="")
    args = ap.parse_args()
    split = load_split()
    reference = torch_answers(Path(args.compare)) if args.compare else {}
    port = free_port()
    daemon = subprocess.Popen([sys.executable, "-m", "loomd", "serve", str(REPO / "samples/scout/model.json"),
                               "--listen", f"127.0.0.1:{port}"], cwd=REPO)
    lines = []
    try:
        ready(port, time.monotonic() + 900)
        for name in ("eval_seen", "eval_unseen"):
            n = len(split[name])
            sel = np.unique(np.linspace(0, n - 1, min(n, args.limit)).round().astype(int))
            entries = [split[name][i] for i in sel]
            start, answers = time.time(), []
            for e in entries:
                png = io.BytesIO()
                render(e["cp"], e["seed"]).save(png, "PNG")
                url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
                body = {"model": "scout", "temperature": 0, "max_tokens": 16, "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url, "detail": args.detail}},
                    {"type": "text", "text": QUESTION}]}]}
                answers.append(post(port, "/v1/chat/completions", body)["choices"][0]["message"]["content"].strip())
            hit = [names(a, e["head"]) for a, e in zip(answers, entries)]
            full = [all_words(a, e["caption"]) for a, e in zip(answers, entries)]
            same = [reference.get((name, e["cp"])) == a for a, e in zip(answers, entries)]
            lines.append(f"\n### {name} (Loom, detail={args.detail}, {len(entries)} renderings, "
                         f"{time.time() - start:.0f}s)\n")
            lines.append("| emoji | caption (target) | head noun | answer | named |")
            lines.append("|---|---|---|---|---|")
            for e, a, h in zip(entries, answers, hit):
                lines.append(f"| U+{e['cp']:04X} | {e['caption']} | {e['head']} | {a.replace('|', '/')} | "
                             f"{'yes' if h else 'no'} |")
            lines.append(f"\n**{name}: head noun named {sum(hit)}/{len(hit)} = {100 * sum(hit) / len(hit):.0f} %; "
                         f"all name words {sum(full)}/{len(full)} = {100 * sum(full) / len(full):.0f} %**")
            if reference:
                lines.append(f"\n{sum(same)}/{len(same)} answers are word for word evaluate.py's (torch) answers.")
            print("\n".join(lines[-len(entries) - 6:]), flush=True)
    finally:
        daemon.terminate()
        daemon.wait(60)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
