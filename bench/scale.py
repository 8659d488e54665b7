"""Scale-out: aggregate chat throughput of 1 vs 2 replicas, with and without affinity routing.

Run by hand (never in CI):

    .venv/bin/python bench/scale.py
    .venv/bin/python bench/scale.py --conversations 8 --turns 3 --clients 4 --configs 1,2,2n
    .venv/bin/python bench/scale.py --sessions            # tag conversations with X-Loom-Session

Each configuration is its own `python -m loomd scale DOC --replicas N --threads T
[--no-affinity]` subprocess (a local Ray cluster, N Loom replicas of one CPU each behind the
Ray Serve ingress) on a free loopback port, started one at a time: the benchmark waits until
every replica's registrations are `ready` in the ingress's `/v1/status` (with a deadline),
warms each replica with one chat of its own (`X-Loom-Replica: N`, a prefix no conversation
shares), runs the workload, reads the ingress's routing decisions, and stops the server with
SIGINT (which shuts its Ray cluster down) before the next one starts. `--configs` names them:
`1` is one replica with affinity, `2` two replicas with affinity, `2n` two replicas with
`--no-affinity` (least-loaded routing alone).

The workload is session-heavy: `--conversations` conversations of `--turns` turns, run by
`--clients` concurrent clients. Every conversation has its own system prompt (different from
its first token on) and a long first user message, and each turn sends the whole history
(earlier user messages and the assistant's answers, then a new user message) with
`temperature: 0` and `--max-tokens`. A client takes the next conversation waiting in a queue,
sends its next turn, and puts it back at the end of the queue, so the turns of all the
conversations interleave (each conversation has one turn in flight at most). Untagged by
default, so what is measured is the ingress's prefix affinity (the replica that served the
longest prefix of a history gets its next turn); `--sessions` tags each conversation with
`X-Loom-Session` instead (owner routing, the session cache).

Per configuration: wall time, completion tokens/s and requests/s aggregate, the sum of
prompt tokens and of `usage.prompt_tokens_details.cached_tokens`, the cached fraction, p50/p95
request latency, errors, and the ingress's routing decisions and requests per replica; then,
from the same run, the ratios (b)/(a) throughput, (b)/(c) throughput and (b)/(c) cached
fraction. The machine (`bench/machine.py`) and the 1-minute load average before each
configuration are printed with the figures: on a small machine shared with other work the
figures are noisy, and a load average well above what this benchmark runs says so.

What a replica can reuse is bounded by the document: the bundled scout keeps
`session_cache_capacity` 8 retained histories and `prefix_cache_capacity` 1024 positions per
replica, so 16 interleaved conversations overflow one replica's retained histories (each is
evicted before its next turn comes) but fit in two replicas' when every conversation stays on
one of them. The default of 12 conversations is chosen for that: more than one replica's 8
retained histories, fewer than two replicas' (6 each, plus its warm-up chat). With 16, each of
two replicas gets 8 conversations plus its warm-up history, one more than it retains, and the
LRU order of the turns evicts every history before its next turn on both configurations (a
first run here: cached fraction 0.035 on one replica, 0.058 on two with affinity). The header
prints these capacities; the cached fractions depend on them and on `--conversations`.

The server's output (Ray's, the replicas' and the ingress's logs) goes to a file per
configuration under `--log-dir` (default: a temporary directory, printed); any Python
traceback in it is printed at the end of that configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe  # noqa: E402  (bench/machine.py, beside this script)

READY_DEADLINE_S = 600.0      # Ray's start, each replica's compilation and weight preparation
REQUEST_TIMEOUT_S = 300.0     # one chat, start to end of body
STOP_GRACE_S = 90.0           # SIGINT to exit: Serve and Ray shut down
TOPICS = ("the history of printing in Europe", "how river deltas form and shift", "the design of suspension bridges",
          "the migration of arctic terns", "early mechanical clocks", "the chemistry of bread dough",
          "lighthouse keeping in the nineteenth century", "how glaciers carve valleys", "the first public libraries",
          "violin making in Cremona", "the navigation of Polynesian voyagers", "the invention of the telegraph",
          "coral reef ecosystems", "the Silk Road's caravan cities", "medieval cathedral construction",
          "the physics of sailing upwind", "tea cultivation in the highlands", "the mapping of the night sky",
          "paper making by hand", "the postal systems of empires")
FOLLOW_UPS = ("Can you say more about the most surprising part of that?",
              "What would a beginner most often misunderstand about it?",
              "Summarise that in two sentences for a child.",
              "Which single detail would you tell a friend first, and why?",
              "What changed about it in the last hundred years?",
              "Give one example that makes it concrete.")


@dataclass(frozen=True)
class Config:
    label: str       # a, b, c, ...
    spec: str        # as given in --configs
    replicas: int
    affinity: bool

    def describe(self) -> str:
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''}, affinity {'on' if self.affinity else 'off'}"


def parse_configs(text: str) -> list[Config]:
    configs = []
    for i, spec in enumerate(s.strip() for s in text.split(",") if s.strip()):
        affinity = not spec.endswith("n")
        try:
            replicas = int(spec.rstrip("n"))
        except ValueError:
            raise SystemExit(f"--configs: {spec!r} is not N or Nn (N replicas; n: --no-affinity)") from None
        if replicas < 1:
            raise SystemExit(f"--configs: {spec!r}: at least one replica")
        configs.append(Config(chr(ord("a") + i), spec, replicas, affinity))
    return configs


# ---- the workload ------------------------------------------------------------------------------------

def first_message(k: int, words: int) -> str:
    """A long first question for conversation k: its own topic, padded with its own detail."""
    topic = TOPICS[k % len(TOPICS)]
    detail = (f"I am writing notes number {k} about {topic}. I want to understand where it started, who was "
              f"involved, what problems had to be solved along the way, which tools and materials mattered, how "
              f"ideas travelled between places, what went wrong and what people learned from the mistakes, and "
              f"how the whole thing looks from today. ")
    text = detail
    while len(text.split()) < words:
        text += f"Please keep in mind point {len(text.split())} of my notes on {topic}: " + detail
    return " ".join(text.split()[:words]) + f" So, to begin: tell me about {topic}."


def system_prompt(k: int) -> str:
    return (f"Conversation {k}. You are a patient tutor for a reader studying {TOPICS[k % len(TOPICS)]}. "
            f"Answer plainly and briefly, and stay on the topic.")


@dataclass
class Conversation:
    index: int
    session: str | None
    messages: list[dict[str, str]] = field(default_factory=list)
    turn: int = 0


@dataclass
class Result:
    latency: float
    status: int | str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    detail: str = ""


async def chat_turn(client: aiohttp.ClientSession, base: str, model: str, conv: Conversation, args) -> Result:
    if conv.turn == 0:
        conv.messages = [{"role": "system", "content": system_prompt(conv.index)},
                         {"role": "user", "content": first_message(conv.index, args.first_words)}]
    else:
        conv.messages.append({"role": "user", "content": FOLLOW_UPS[(conv.index + conv.turn) % len(FOLLOW_UPS)]})
    body = {"model": model, "messages": conv.messages, "temperature": 0, "max_tokens": args.max_tokens}
    headers = {"X-Loom-Session": conv.session} if conv.session else {}
    started = time.monotonic()
    try:
        async with client.post(base + "/v1/chat/completions", json=body, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
            data = await r.read()
            latency = time.monotonic() - started
            if r.status != 200:
                return Result(latency, r.status, detail=data.decode("utf-8", "replace")[:2000])
            answer = json.loads(data)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        return Result(time.monotonic() - started, "transport", detail=repr(exc))
    usage = answer.get("usage") or {}
    content = answer["choices"][0]["message"].get("content") or ""
    conv.messages.append({"role": "assistant", "content": content})
    conv.turn += 1
    return Result(latency, 200, usage.get("prompt_tokens", 0),
                  (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0,
                  usage.get("completion_tokens", 0))


async def workload(base: str, model: str, args, run_tag: str) -> tuple[list[Result], float]:
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for k in range(args.conversations):
        queue.put_nowait(Conversation(k, f"bench-scale-{run_tag}-{k}" if args.sessions else None))
    results: list[Result] = []
    remaining = args.conversations * args.turns

    async def client_loop(client: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            try:
                conv = queue.get_nowait()
            except asyncio.QueueEmpty:     # every waiting conversation has a turn in flight elsewhere
                await asyncio.sleep(0.01)
                continue
            result = await chat_turn(client, base, model, conv, args)
            results.append(result)
            if result.status != 200:       # a failed turn ends its conversation (its history has no answer)
                remaining -= args.turns - conv.turn
                continue
            remaining -= 1
            if conv.turn < args.turns:
                queue.put_nowait(conv)

    connector = aiohttp.TCPConnector(limit=args.clients)
    async with aiohttp.ClientSession(connector=connector) as client:
        started = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(args.clients)))
        return results, time.monotonic() - started


# ---- the server ------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(config: Config, document: Path, args, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "loomd", "scale", str(document), "--replicas", str(config.replicas),
               "--listen", f"127.0.0.1:{port}", "--threads", str(args.threads)]
    if not config.affinity:
        command.append("--no-affinity")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)    # always a local cluster of its own
    log = open(log_path, "w")
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    log.close()
    return process, f"http://127.0.0.1:{port}"


async def wait_ready(base: str, process: subprocess.Popen, replicas: int) -> tuple[str, dict[str, Any]]:
    """Poll the ingress's /v1/status until every replica answers and all its registrations are
    `ready`; returns the model served and the status."""
    deadline = time.monotonic() + READY_DEADLINE_S
    last = "no answer yet"
    async with aiohttp.ClientSession() as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"loomd scale exited with {process.returncode} before it was ready ({last})")
            try:
                async with client.get(base + "/v1/status", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    status = await r.json(content_type=None)
                entries = status.get("replicas", [])
                regs = [reg for e in entries for reg in e.get("registrations", [])]
                failed = [f"replica {e['replica']} {reg['model']}: {reg.get('error')}" for e in entries
                          for reg in e.get("registrations", []) if reg.get("phase") == "failed"]
                if failed:
                    raise RuntimeError("registration failed: " + "; ".join(failed))
                phases = [f"{e.get('replica')}:" + ",".join(reg.get("phase", "?") for reg in e.get("registrations", []))
                          + (f" ({e['error']})" if "error" in e else "") for e in entries]
                last = f"{r.status}: replicas {' '.join(phases) or 'none'}"
                if (len(entries) == replicas and all("error" not in e and e.get("registrations") for e in entries)
                        and all(reg.get("phase") == "ready" for reg in regs)):
                    return regs[0]["model"], status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, AttributeError) as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {READY_DEADLINE_S:.0f} s (last: {last})")
            await asyncio.sleep(1.0)


async def warm(base: str, model: str, replicas: int, args) -> None:
    """One short chat on each replica by name (kernels' first launches), on a prefix no conversation has."""
    async with aiohttp.ClientSession() as client:
        for n in range(replicas):
            body = {"model": model, "temperature": 0, "max_tokens": min(args.max_tokens, 8),
                    "messages": [{"role": "user", "content": f"Warm-up {n}: say hello."}]}
            async with client.post(base + "/v1/chat/completions", json=body, headers={"X-Loom-Replica": str(n)},
                                   timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
                data = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"warm-up chat on replica {n}: {r.status} {data[:500]!r}")


async def get_status(base: str) -> dict[str, Any] | None:
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(base + "/v1/status", timeout=aiohttp.ClientTimeout(total=30)) as r:
                return await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return None


def session_processes(sid: int) -> list[int]:
    """Processes still in the server's session (Ray's daemons and workers started under it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def stop_server(process: subprocess.Popen) -> str:
    """SIGINT (loomd scale shuts Serve and Ray down), then whatever is left of its session by pid."""
    sid = process.pid
    outcome = ""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            outcome = f"did not exit within {STOP_GRACE_S:.0f} s of SIGINT: killed; "
    outcome += f"exit status {process.returncode}"
    deadline = time.monotonic() + 15
    left = session_processes(sid)
    while left and time.monotonic() < deadline:    # Ray's own processes exit shortly after the driver
        time.sleep(0.5)
        left = session_processes(sid)
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        outcome += f"; {len(left)} process(es) of its session left behind, killed"
    return outcome


def tracebacks(log_path: Path) -> list[str]:
    """Every Python traceback in the server's log, with the line after it ends."""
    lines = log_path.read_text(errors="replace").splitlines()
    found, i = [], 0
    while i < len(lines):
        if "Traceback (most recent call last)" in lines[i]:
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or "  File " in lines[j]
                                      or lines[j].strip().startswith(("^", "~"))):
                j += 1
            found.append("\n".join(lines[max(i - 1, 0):min(j + 1, len(lines))]))
            i = j
        else:
            i += 1
    return found


# ---- the figures -----------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Figures:
    config: Config
    wall: float
    requests: int
    errors: int
    prompt: int
    cached: int
    completion: int
    p50: float
    p95: float
    routing: dict[str, Any]
    served: list[int]
    load_before: float

    @property
    def tokens_per_s(self) -> float:
        return self.completion / self.wall if self.wall else 0.0

    @property
    def cached_fraction(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


def figures(config: Config, results: list[Result], wall: float, status: dict[str, Any] | None,
            load_before: float) -> Figures:
    ok = [r for r in results if r.status == 200]
    routing = (status or {}).get("routing", {})
    served = [r.get("served", 0) - 1 for r in routing.get("replicas", [])]   # less its warm-up chat
    return Figures(config, wall, len(results), len(results) - len(ok), sum(r.prompt_tokens for r in ok),
                   sum(r.cached_tokens for r in ok), sum(r.completion_tokens for r in ok),
                   percentile([r.latency for r in ok], 0.5), percentile([r.latency for r in ok], 0.95),
                   routing.get("decisions", {}), served, load_before)


def print_figures(f: Figures) -> None:
    print(f"  wall {f.wall:.1f} s; {f.requests} requests, {f.errors} failed; "
          f"{f.completion} completion tokens: {f.tokens_per_s:.1f} tok/s, {f.requests / f.wall:.2f} req/s aggregate")
    print(f"  prompt tokens {f.prompt}, cached {f.cached}: cached fraction {f.cached_fraction:.3f}")
    print(f"  latency p50 {f.p50:.2f} s, p95 {f.p95:.2f} s")
    print(f"  routing decisions {json.dumps(f.routing, sort_keys=True)}; workload requests per replica "
          f"{f.served}", flush=True)


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "n/a"


def print_summary(done: list[Figures], args) -> None:
    print("\nsummary (machine: " + describe() + ")")
    print(f"workload: {args.conversations} conversations x {args.turns} turns, {args.clients} clients, "
          f"max_tokens {args.max_tokens}, first message {args.first_words} words, "
          f"{'X-Loom-Session tagged' if args.sessions else 'untagged'}, {args.threads} thread(s) per replica")
    print(f"{'config':34} {'wall s':>7} {'tok/s':>7} {'req/s':>6} {'prompt':>7} {'cached':>7} {'frac':>6} "
          f"{'p50 s':>6} {'p95 s':>6} {'err':>4} {'load1':>6}")
    for f in done:
        name = f"({f.config.label}) {f.config.describe()}"
        print(f"{name:34} {f.wall:7.1f} {f.tokens_per_s:7.1f} {f.requests / f.wall:6.2f} {f.prompt:7d} {f.cached:7d} "
              f"{f.cached_fraction:6.3f} {f.p50:6.2f} {f.p95:6.2f} {f.errors:4d} {f.load_before:6.2f}")
    by = {(f.config.replicas, f.config.affinity): f for f in done}
    one, two, two_n = by.get((1, True)), by.get((2, True)), by.get((2, False))
    print("ratios (same run):")
    if one and two:
        print(f"  throughput 2 replicas affinity / 1 replica:         {ratio(two.tokens_per_s, one.tokens_per_s)}")
    if two and two_n:
        print(f"  throughput 2 replicas affinity / no affinity:       {ratio(two.tokens_per_s, two_n.tokens_per_s)}")
        print(f"  cached fraction 2 replicas affinity / no affinity:  {ratio(two.cached_fraction, two_n.cached_fraction)}")
    if not ((one and two) or (two and two_n)):
        print("  (none: --configs needs 1 and 2, or 2 and 2n)")
    print("note: measured on a shared machine; other work running at the same time (see load1, the 1-minute load "
          "average before each configuration) makes these figures noisy. Repeat before quoting them.")


# ---- the run --------------------------------------------------------------------------------------

def run_config(config: Config, document: Path, args, log_dir: Path) -> Figures | None:
    log_path = log_dir / f"scale-{config.label}-{config.spec}.log"
    load_before = os.getloadavg()[0]
    print(f"\n({config.label}) {config.describe()}: starting loomd scale (log {log_path}); "
          f"load average before {load_before:.2f}", flush=True)
    started = time.monotonic()
    process, base = start_server(config, document, args, log_path)
    result = None
    try:
        model, _ = asyncio.run(wait_ready(base, process, config.replicas))
        print(f"  {base}: {config.replicas} replica(s) ready in {time.monotonic() - started:.0f} s ({model})",
              flush=True)
        asyncio.run(warm(base, model, config.replicas, args))
        results, wall = asyncio.run(workload(base, model, args, f"{config.label}{os.getpid()}"))
        status = asyncio.run(get_status(base))
        if status is not None and status.get("lost"):
            print(f"  replicas lost during the run: {status['lost']}")
        result = figures(config, results, wall, status, load_before)
        print_figures(result)
        failures = [r for r in results if r.status != 200]
        for r in failures[:3]:
            print(f"  e.g. failed request: {r.status} {r.detail}")
    except RuntimeError as exc:
        print(f"  FAILED: {exc}")
    finally:
        print(f"  stopping: {stop_server(process)}", flush=True)
    for tb in tracebacks(log_path):
        print(f"  traceback in the server log ({log_path}):\n" + "\n".join("    " + line for line in tb.splitlines()))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", "-S", type=int, default=12,
                        help="conversations (default 12: fits two replicas' retained histories, not one's; see the docstring)")
    parser.add_argument("--turns", "-T", type=int, default=4, help="turns per conversation (default 4)")
    parser.add_argument("--clients", "-C", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every turn (default 32)")
    parser.add_argument("--first-words", type=int, default=160,
                        help="words in each conversation's first user message (default 160)")
    parser.add_argument("--configs", default="1,2,2n",
                        help="configurations in order, comma-separated: N replicas with affinity, Nn without "
                             "(default 1,2,2n: (a) 1 replica, (b) 2 replicas, (c) 2 replicas --no-affinity)")
    parser.add_argument("--sessions", action="store_true",
                        help="tag each conversation with X-Loom-Session (default: untagged, prefix affinity)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per replica (default 1)")
    parser.add_argument("--document", type=Path, default=REPO / "samples" / "scout" / "model.json",
                        help="the text model document to serve (default samples/scout/model.json)")
    parser.add_argument("--log-dir", type=Path, help="where the servers' logs go (default: a temporary directory)")
    args = parser.parse_args()
    configs = parse_configs(args.configs)
    if not configs:
        raise SystemExit("--configs: no configuration")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="loom-bench-scale-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    print("machine:", describe())
    try:
        fields = json.loads(args.document.read_text())
        print("document capacities per replica: " + ", ".join(
            f"{k} {fields.get(k, 0)}" for k in ("rows", "pool_capacity", "session_cache_capacity",
                                                 "prefix_cache_capacity")))
    except (OSError, ValueError, AttributeError):
        pass
    print(f"document {args.document}; {args.conversations} conversations x {args.turns} turns by {args.clients} "
          f"clients, max_tokens {args.max_tokens}, {'X-Loom-Session tagged' if args.sessions else 'untagged'}; "
          f"configurations {', '.join(f'({c.label}) {c.describe()}' for c in configs)}", flush=True)
    done = [f for f in (run_config(c, args.document.resolve(), args, log_dir) for c in configs) if f is not None]
    print_summary(done, args)
    return 0 if len(done) == len(configs) and all(f.errors == 0 for f in done) else 1


if __name__ == "__main__":
    sys.exit(main())
