"""Every curl example of the spec (http-profiles.md) run verbatim through bash against a real
`loomd` (only the URL's port differs), and a check that every example the spec has is run by
some test (`spec_examples.EXAMPLES`; the transcription examples run in
test_transcriptions_endpoint.py, beside the recognizer they need).

Staging ("Uploaded source packages", the conftest's `mini` daemon): the example's files are
made real. `advance.loombc` is `loomc build` of the mini package's kernels, and `config.loom`
holds the candidate's commands (affine adds its bias twice), which `use` the control/prepare
providers by absolute server path and the kernels through the package-relative
`advance.loombc`. Together they are a complete native provider set.

Known-token sequences and input-token counting share one daemon serving `encoder` and
`scout`: the sequences example's SSE stream carries the three ids as attached/chunk/done
events, and the count of the example's request.json equals the prompt_tokens that
/v1/chat/completions reports for the same bytes.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from admin_http import ORIGINAL, absolute_uses, registrations
from conformance_support import checked_sequence, encoder_document
from scout_daemon import READY_DEADLINE_S, start_scout
from spec_examples import (EXAMPLES, INPUT_TOKENS, SEQUENCES, SPEC, STAGING, run_example,
                           spec_curl_commands)

KERNELS = ORIGINAL[ORIGINAL.index("kernel add_bias"):ORIGINAL.index("command affine")]
TWICE = ORIGINAL.replace("    add_bias(y, b)\n", "    add_bias(y, b)\n    add_bias(y, b)\n")
COMMANDS = TWICE[TWICE.index("command affine"):]


def config_loom(commands: str = COMMANDS) -> str:
    head = absolute_uses('use "control.loom" { dim }\nuse "prepare.loom" { w, b }\n')
    return head + 'use "advance.loombc" { add_bias, running_sum }\n\nstate acc: f32[dim] per row\n\n' + commands


def inventory(daemon, model: str) -> dict:
    return daemon.request("GET", "/v1/models/variants", headers={"X-Loom-Model": model}).json()


def prepare_files(directory: Path, model: str, base: int, config: str) -> None:
    (directory / "candidate.json").write_text(json.dumps(
        {"model": model, "base": base, "sources": ["config.loom", "advance.loombc"]}))
    (directory / "config.loom").write_text(config)
    (directory / "kernels.loom").write_text(KERNELS)
    built = subprocess.run([sys.executable, "-m", "loomc", "build", "kernels.loom", "-o", "advance.loombc"],
                           cwd=directory, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert (directory / "advance.loombc").read_bytes()


# ---- every example has a test --------------------------------------------------------------------

def test_curl_is_installed():
    assert shutil.which("curl"), "curl is not installed; the spec's examples need it"


def test_every_spec_curl_example_is_run_by_a_test():
    """The spec's commands are exactly `EXAMPLES`, in order; each example's test function exists
    and uses the constant holding the command."""
    if SPEC.is_file():                   # the spec lives beside the repository in this workspace
        assert spec_curl_commands(SPEC.read_text()) == [e.command for e in EXAMPLES]
    here = Path(__file__).parent
    for example in EXAMPLES:
        module, function = example.test.split("::")
        tree = ast.parse((here / module).read_text())
        [definition] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        used = {n.id for n in ast.walk(definition) if isinstance(n, ast.Name)}
        assert example.name in used, f"{example.test} does not run {example.name}"


def test_extraction_finds_continued_commands():
    text = "Intro\n\ncurl -s http://127.0.0.1:8080/a \\\n  -d x\n\ncurl http://localhost:8080/b\nafter \\\n"
    assert spec_curl_commands(text) == ["curl -s http://127.0.0.1:8080/a \\\n  -d x",
                                        "curl http://localhost:8080/b"]


# ---- uploaded source packages: staging ----------------------------------------------------------

def test_staging_example_stages_a_ready_variant(daemon, tmp_path):
    before = inventory(daemon, "mini")
    prepare_files(tmp_path, "mini", before["selected"], config_loom())
    done = run_example(STAGING, daemon.port, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    body = json.loads(done.stdout)
    assert body["selected"] == before["selected"]                 # staging never selects
    v = body["variant"]
    assert v["object"] == "variant" and v["phase"] == "ready" and v["base"] == before["selected"], v
    assert v["sources"] == ["model/config.loom", "model/advance.loombc"]
    assert v["diagnostics"] == [] and set(v["stages"]) == {"affine", "accumulate"}
    after = inventory(daemon, "mini")
    assert after["selected"] == before["selected"] and after["count"] == before["count"] + 1

    # the staged candidate is selectable like any other; then the model runs it
    response = daemon.request("POST", "/v1/models/variants/select",
                              {"model": "mini", "variant": v["id"], "expected": before["selected"]})
    assert response.status == 200 and response.json() == {"selected": v["id"]}
    assert registrations(daemon)["mini"]["variants"]["selected"] == v["id"]
    records = {r["id"]: r for r in inventory(daemon, "mini")["data"]}
    assert records[v["id"]]["users"] == 1 and records[before["selected"]]["users"] == 0


def test_staging_example_fails_with_body_on_a_broken_candidate(daemon, tmp_path):
    """`--fail-with-body`: a failed compilation is curl's exit 22, with the 422 record printed."""
    before = inventory(daemon, "mini")
    broken = config_loom(COMMANDS.replace("matmul(x, w, y)", "matmul(x, w, y"))
    prepare_files(tmp_path, "mini", before["selected"], broken)
    done = run_example(STAGING, daemon.port, tmp_path)
    assert done.returncode == 22, (done.returncode, done.stdout, done.stderr)
    body = json.loads(done.stdout)
    v = body["variant"]
    assert v["phase"] == "failed" and v["error"]["code"] == "compile_error"
    assert any(d.startswith("model/config.loom:") for d in v["diagnostics"]), v["diagnostics"]
    assert inventory(daemon, "mini")["selected"] == before["selected"]
    assert daemon.request("POST", "/v1/models/variants/remove",
                          {"model": "mini", "variant": v["id"]}).json() == {"removed": v["id"]}


# ---- known-token sequences and input-token counting ----------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One daemon serving `scout` (one row) and `encoder` (samples/encoder, two rows)."""
    tmp = tmp_path_factory.mktemp("curl-models")
    server = start_scout(tmp, encoder_document(tmp), rows=1, context_length=512, max_output_tokens=16)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event, data) pairs of an SSE body as curl printed it."""
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            assert set(fields) == {"event", "data"}, block
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_sequences_example_streams_the_three_ids(models, tmp_path):
    done = run_example(SEQUENCES, models.port, tmp_path, timeout=READY_DEADLINE_S)
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr)
    events = sse_events(done.stdout)
    # attached at position 0, chunks whose token_ids are [11, 27, 42] in order, done at position 3,
    # each chunk carrying 576 f32 hidden states per token (checked_sequence)
    handle, hidden, sizes = checked_sequence(events, [11, 27, 42])
    assert [k for k, _ in events] == ["attached"] + ["chunk"] * len(sizes) + ["done"]
    assert events[-1][1] == {"session": handle, "position": 3}
    assert hidden.shape == (3, 576) and sum(sizes) == 3


REQUEST_JSON = {"model": "scout", "messages": [{"role": "system", "content": "Answer in one word."},
                                              {"role": "user", "content": "What colour is the sky?"}],
                "temperature": 0, "max_tokens": 4}


def test_input_tokens_example_counts_the_prompt(models, tmp_path):
    """The count of request.json equals the prompt_tokens of generating from the same bytes."""
    data = json.dumps(REQUEST_JSON, indent=2).encode()
    (tmp_path / "request.json").write_bytes(data)
    done = run_example(INPUT_TOKENS, models.port, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    counted = json.loads(done.stdout)
    assert set(counted) == {"input_tokens"} and isinstance(counted["input_tokens"], int), counted
    generated = models.request("POST", "/v1/chat/completions", data, timeout=READY_DEADLINE_S)
    assert generated.status == 200, generated.body
    usage = generated.json()["usage"]
    assert usage["prompt_tokens"] == counted["input_tokens"] > 0, (usage, counted)
    assert usage["completion_tokens"] <= REQUEST_JSON["max_tokens"]
