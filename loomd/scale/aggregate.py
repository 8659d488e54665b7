"""One answer from many replicas: discovery, status, lists, metrics and administration outcomes.

Each function takes the replicas' answers as `Outcome`s (the replica, the HTTP status and the
body as the replica sent it) and returns what the ingress answers. Pure functions: the
ingress fetches, these merge, the tests feed them directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loomd.errors import error_body


@dataclass(frozen=True)
class Outcome:
    replica: int
    status: int            # 0: the replica did not answer
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def describe(self) -> dict[str, Any]:
        parsed = self.json()
        return {"replica": self.replica, "status": self.status,
                "body": parsed if parsed is not None else self.body.decode("utf-8", "replace")}


def models(outcomes: list[Outcome]) -> dict[str, Any]:
    """`/v1/models`: every model any replica lists, once (the first replica's object), with
    `loom.replicas` naming the replicas that list it."""
    merged: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        body = outcome.json() if outcome.status == 200 else None
        for model in (body or {}).get("data", []):
            entry = merged.setdefault(model["id"], model)
            entry.setdefault("loom", {}).setdefault("replicas", []).append(outcome.replica)
    return {"object": "list", "data": list(merged.values())}


def status(outcomes: list[Outcome], replicas: list[dict[str, Any]], lost: list[int],
           routing: dict[str, Any]) -> dict[str, Any]:
    """`/v1/status`: each live replica's own status under `replicas` (with its URL, pid and node),
    the replicas lost, and the router's state."""
    info = {r["replica"]: r for r in replicas}
    out = []
    for outcome in outcomes:
        entry = dict(info.get(outcome.replica, {"replica": outcome.replica}))
        body = outcome.json() if outcome.status == 200 else None
        if body is None:
            entry["error"] = f"status {outcome.status}"
        else:
            entry.update(body)
        out.append(entry)
    return {"object": "scale.status", "replicas": out, "lost": lost, "routing": routing}


def listing(outcomes: list[Outcome]) -> dict[str, Any]:
    """`/v1/requests`, `/v1/sessions`: the first page of every replica, each item tagged with its
    `replica`; `next_after` per replica (page on with `X-Loom-Replica: N` and `after`)."""
    data: list[dict[str, Any]] = []
    more: dict[str, Any] = {}
    for outcome in outcomes:
        body = outcome.json() if outcome.status == 200 else None
        for item in (body or {}).get("data", []):
            data.append({**item, "replica": outcome.replica})
        if body and body.get("next_after") is not None:
            more[str(outcome.replica)] = body["next_after"]
    return {"object": "list", "data": data, "next_after": None, "replicas_next_after": more}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def metrics(outcomes: list[Outcome]) -> str:
    """`/metrics`: every replica's series with a `replica` label added; each family's HELP and
    TYPE lines once."""
    seen_meta: set[str] = set()
    families: dict[str, list[str]] = {}
    order: list[str] = []
    current = ""
    for outcome in outcomes:
        if outcome.status != 200:
            continue
        for line in outcome.body.decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(maxsplit=3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    if current not in families:
                        families[current] = []
                        order.append(current)
                    if line not in seen_meta:
                        seen_meta.add(line)
                        families[current].append(line)
                continue
            match = _SAMPLE.match(line)
            if match is None:
                continue
            name, labels, rest = match.groups()
            label = f'replica="{outcome.replica}"'
            labels = "{" + label + ("," + labels[1:] if labels and labels != "{}" else "}")
            families.setdefault(current, []).append(f"{name}{labels}{rest}")
    return "".join(line + "\n" for family in order for line in families[family])


def fanned_out(outcomes: list[Outcome]) -> tuple[int, dict[str, Any]]:
    """An administration request sent to several replicas: the worst status (the highest), the
    body of a replica that answered it (an error's body when one failed), and every replica's
    outcome under `replicas`."""
    worst = max(outcomes, key=lambda o: (o.status == 0, o.status))
    body = worst.json()
    if not isinstance(body, dict):
        body = error_body(502, f"replica {worst.replica} did not answer", "replica_unavailable")
    status = worst.status or 502
    return status, {**body, "replicas": [o.describe() for o in outcomes]}


__all__ = ["Outcome", "fanned_out", "listing", "metrics", "models", "status"]
