"""`loomd scale`: two scout replicas behind the Ray Serve ingress, on a local Ray instance.

One real `loomd scale` process (a Ray cluster of its own, Ray Serve's HTTP proxy on a free
port, two replicas of one thread each) serves the module. Over real HTTP: sessions keep to
their replica (every second turn finds its first turn cached) and both replicas serve some;
untagged chats follow their prefix; administration and metrics span both replicas. Last,
one replica's process is killed: new sessions succeed on the survivor, a checkpoint that
lived on the dead one answers 404 `state_lost`, a stream cut off mid-way ends with an
error event, and `/v1/status` lists one replica.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conformance_support import SseReader
from loomd_process import REPO, Daemon
from scout_daemon import open_stream, scout_document

pytest.importorskip("ray.serve", reason="the scale extra (ray[serve]) is installed by `make test`")

START_DEADLINE_S = 300.0   # Ray, Serve and two replicas compiling scout: a hang guard
SESSIONS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scale")
    doc = scout_document(tmp, rows=4, context_length=1024, max_output_tokens=64, session_cache_capacity=32,
                         checkpoint_capacity=8)
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    process = subprocess.Popen([sys.executable, "-m", "loomd", "scale", str(doc), "--replicas", "2",
                                "--listen", f"127.0.0.1:{port}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    server = Daemon(process, port, "")
    server._drainer = threading.Thread(target=server._drain, daemon=True)
    server._drainer.start()
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "".join(server.output)
            try:
                status = server.request("GET", "/v1/status", timeout=10, check_health=False)
                if status.status == 200:
                    replicas = status.json()["replicas"]
                    phases = [r["phase"] for rep in replicas for r in rep.get("registrations", [])]
                    if len(replicas) == 2 and phases == ["ready", "ready"]:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        yield server
    finally:
        code = None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        try:   # whatever of its Ray cluster outlived it (its own process group)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    assert code == 0, "".join(server.output)[-3000:]


def chat(server: Daemon, messages: list[dict], **headers: str):
    body = {"model": "scout", "messages": messages, "max_tokens": 8, "temperature": 0}
    return server.request("POST", "/v1/chat/completions", body, headers or None, timeout=120)


def two_turns(server: Daemon, first: str, **headers: str) -> tuple[dict, dict]:
    messages = [{"role": "user", "content": first}]
    one = chat(server, messages, **headers)
    assert one.status == 200, one.body
    messages += [one.json()["choices"][0]["message"], {"role": "user", "content": "Say it again, shorter."}]
    two = chat(server, messages, **headers)
    assert two.status == 200, two.body
    return one.json()["usage"], two.json()["usage"]


def status(server: Daemon) -> dict:
    response = server.request("GET", "/v1/status", timeout=60)
    assert response.status == 200, response.body
    return response.json()


def session_owners(server: Daemon) -> dict[str, int]:
    listed = server.request("GET", "/v1/sessions?limit=100", timeout=60)
    assert listed.status == 200, listed.body
    return {item["session"]: item["replica"] for item in listed.json()["data"] if "session" in item}


def test_sessions_keep_to_their_replica_and_both_replicas_serve(scaled):
    for i in range(SESSIONS):
        first, second = two_turns(scaled, f"Session {i}: name a fruit and its colour.", **{"X-Loom-Session": f"s{i}"})
        assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"], (i, first, second)
    owners = session_owners(scaled)
    assert {f"s{i}" for i in range(SESSIONS)} <= set(owners), owners
    assert {owners[f"s{i}"] for i in range(SESSIONS)} == {0, 1}, owners


def test_untagged_chats_follow_their_longest_prefix(scaled):
    before = status(scaled)["routing"]["decisions"].get("prefix", 0)
    for i in range(4):
        first, second = two_turns(scaled, f"Untagged {i}: what is {i} plus {i}?")
        assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"], (i, first, second)
    assert status(scaled)["routing"]["decisions"]["prefix"] - before == 4


def test_discovery_administration_and_metrics_span_both_replicas(scaled):
    models = scaled.request("GET", "/v1/models").json()
    assert [(m["id"], m["loom"]["replicas"]) for m in models["data"]] == [("scout", [0, 1])]
    drained = scaled.request("POST", "/v1/models/drain", {"model": "scout"})
    assert drained.status == 200, drained.body
    assert [(r["replica"], r["status"]) for r in drained.json()["replicas"]] == [(0, 200), (1, 200)]
    refused = chat(scaled, [{"role": "user", "content": "hi"}])
    assert refused.status == 503 and refused.json()["error"]["code"]
    undrained = scaled.request("POST", "/v1/models/undrain", {"model": "scout"}, {"X-Loom-Replicas": "1"})
    assert [(r["replica"], r["status"]) for r in undrained.json()["replicas"]] == [(1, 200)]
    scaled.request("POST", "/v1/models/undrain", {"model": "scout"})
    assert chat(scaled, [{"role": "user", "content": "hi"}]).status == 200
    text = scaled.request("GET", "/metrics").body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    replicas = {s.labels["replica"] for s in families["loom_prompt_tokens"].samples}
    assert replicas == {"0", "1"}, text[:2000]


def test_a_killed_replica_loses_its_state_and_the_survivor_serves(scaled):
    owners = session_owners(scaled)
    victim_sessions = sorted(s for s, r in owners.items() if r == 1 and s.startswith("s"))
    assert victim_sessions, owners
    pinned = scaled.request("POST", "/v1/checkpoints/kept", None,
                            {"X-Loom-Session": victim_sessions[0], "X-Loom-Model": "scout"})
    assert pinned.status == 201, pinned.body
    replicas = {r["replica"]: r for r in status(scaled)["replicas"]}

    # a stream in flight on the victim, read past its first event, then the victim dies
    long = {"model": "scout", "stream": True, "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to fifty in words."}]}
    with open_stream(scaled, long, headers={"X-Loom-Session": victim_sessions[-1]}) as s:
        reader = SseReader(s)
        assert reader.head() == 200
        assert reader.next_event() is not None
        os.kill(replicas[1]["pid"], signal.SIGKILL)
        events = reader.read_all()
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["error"]["code"] == "replica_lost", events[-3:]   # cut off, cleanly

    lost = scaled.request("POST", "/v1/chat/completions",
                          {"model": "scout", "messages": [{"role": "user", "content": "again"}], "max_tokens": 4},
                          {"X-Loom-Checkpoint": "kept"})
    assert lost.status == 404 and lost.json()["error"]["code"] == "state_lost", lost.body
    for i in range(4):
        fresh = chat(scaled, [{"role": "user", "content": f"A new session {i}."}], **{"X-Loom-Session": f"after{i}"})
        assert fresh.status == 200, fresh.body
    moved = chat(scaled, [{"role": "user", "content": "Back again."}], **{"X-Loom-Session": victim_sessions[0]})
    assert moved.status == 200, moved.body          # a session is best effort: replayed on the survivor
    final = status(scaled)
    assert [r["replica"] for r in final["replicas"]] == [0] and final["lost"] == [1]
    assert scaled.request("GET", "/healthz").json() == {"status": "ready"}
