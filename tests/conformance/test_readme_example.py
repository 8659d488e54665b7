"""What `make serve` starts, and the README's curl example against it, verbatim.

`make serve` runs `loomd serve` with no documents, which serves the bundled samples whose
weights are installed (the embedded default). This starts the same command (on a free port
instead of 8080), waits until scout is ready as the README says to, and runs the README's
chat example through bash with only the port substituted.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from conformance_support import serving
from loomd_process import REPO, Daemon

README = REPO / "README.md"
README_URL = "http://127.0.0.1:8080"
BUNDLED = ["scout", "vectors", "judge", "encoder", "recognizer", "speaker", "illustrator"]
READY_DEADLINE_S = 600.0   # seven samples compile and prepare; a hang guard


def readme_chat_example() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    [command] = [b for b in blocks if "/v1/chat/completions" in b]
    return command.strip()


def test_make_serve_runs_loomd_on_the_bundled_samples():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^serve: install\n\t\$\(VENV\)/bin/loomd serve\n", makefile, re.M), \
        "the README's `make serve` is `loomd serve` with no documents"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    with serving(Daemon.start(tmp_path_factory.mktemp("bundled"), []), BUNDLED, READY_DEADLINE_S) as server:
        yield server


def test_the_readme_curl_example_answers(bundled):
    command = readme_chat_example()
    assert README_URL in command
    run = subprocess.run(["bash", "-c", command.replace(README_URL, f"http://127.0.0.1:{bundled.port}")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["object"] == "chat.completion" and answer["model"] == "scout"
    assert "Paris" in answer["choices"][0]["message"]["content"]


def test_every_bundled_sample_is_listed(bundled):
    models = bundled.request("GET", "/v1/models").json()
    assert sorted(m["id"] for m in models["data"]) == sorted(BUNDLED)


ENDPOINTS = {"scout": "text on {url}/v1/chat/completions", "vectors": "embedding on {url}/v1/embeddings",
             "judge": "decision on {url}/v1/systemone", "encoder": "sequence on {url}/v1/sequences",
             "recognizer": "recognition on {url}/v1/audio/transcriptions", "speaker": "speech on {url}/v1/audio/speech",
             "illustrator": "image on {url}/v1/images/generations"}


def test_the_terminal_says_where_each_sample_is_served(bundled):
    """A newcomer knows when scout is ready without reading docs: `loomd serve` prints the URL
    it listens on, each sample's registration, its phases and one ready line with kind and URL."""
    url = f"http://127.0.0.1:{bundled.port}"
    expected = {name: f"loomd: {name} ready in " for name in BUNDLED}
    deadline = time.monotonic() + 30   # the line follows the phase change on the worker thread
    while time.monotonic() < deadline:
        output = "".join(bundled.output)
        if all(prefix in output for prefix in expected.values()):
            break
        time.sleep(0.05)
    assert f"loomd: listening on {url} (status page {url}/ui)\n" in output, output
    for name in BUNDLED:
        assert f"loomd: registering {name} (" in output and f"loomd: {name}: compiling\n" in output, output
        line = re.search(rf"loomd: {name} ready in \d+\.\ds: (.*)\n", output)
        assert line is not None and line.group(1) == ENDPOINTS[name].format(url=url), output
