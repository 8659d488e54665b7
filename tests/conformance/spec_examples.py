"""Every `curl` example of the HTTP spec (http-profiles.md), verbatim, and the test that runs it.

`EXAMPLES` lists each command with the constant that holds it and the test function that runs
it through bash against a real `loomd` (only the URL's port differs: `run_example`).
`test_curl_examples.test_every_spec_curl_example_is_run_by_a_test` extracts the commands from
the spec and requires them to be exactly these, in order, each named by its test: a new example
in the spec without a test fails there.

The spec lives beside the repository in this workspace (`../shared/spec/http-profiles.md`);
`LOOM_SPEC` names another copy (a clone elsewhere)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loomd_process import REPO

SPEC = Path(os.environ.get("LOOM_SPEC") or REPO.parent / "shared" / "spec" / "http-profiles.md")
#: The addresses the spec's examples use; `run_example` replaces them with the test daemon's.
SPEC_URLS = ("http://127.0.0.1:8080", "http://localhost:8080")

#: "Uploaded source packages": stage a candidate from a multipart source package.
STAGING = """curl --fail-with-body -H 'Expect:' \\
  http://127.0.0.1:8080/v1/models/variants \\
  -F 'request=@candidate.json;type=application/json;filename=model/candidate.json' \\
  -F 'file=@config.loom;filename=model/config.loom' \\
  -F 'file=@advance.loombc;filename=model/advance.loombc'"""

#: "Known-token sequences": three known ids through the encoder, streamed as SSE.
SEQUENCES = """curl -N http://localhost:8080/v1/sequences \\
  -H 'Content-Type: application/json' \\
  -d '{"model":"encoder","position":0,"token_ids":[11,27,42],"options":{}}'"""

#: "Audio transcription": a WAV recording.
TRANSCRIPTION_WAV = """curl --fail-with-body -H 'Expect:' \\
  http://127.0.0.1:8080/v1/audio/transcriptions \\
  -F model=recognizer \\
  -F 'file=@recording.wav;type=audio/wav'"""

#: "Audio transcription": raw PCM16LE at 24 kHz.
TRANSCRIPTION_PCM = """curl --fail-with-body -H 'Expect:' \\
  http://127.0.0.1:8080/v1/audio/transcriptions \\
  -F model=recognizer \\
  -F 'file=@recording.pcm;headers="Content-Type: audio/pcm;rate=24000;channels=1"'"""

#: "Count a chat before generating": a chat body saved as request.json.
INPUT_TOKENS = """curl http://localhost:8080/v1/chat/completions/input_tokens \\
  -H 'Content-Type: application/json' --data-binary @request.json"""

#: "Image generation": the section's two JSON bodies, verbatim (no curl command: they run in
#: test_images_endpoint.py::test_the_spec_example_bodies, which checks they are in the spec).
IMAGES_SIZE_BODY = ('{"model":"illustrator","prompt":"a red fox in the snow","size":"1536x1024","seed":"0",'
                    '"response_format":"b64_json"}')
IMAGES_LORAS_BODY = ('{"model":"illustrator","prompt":"a red fox in the snow",'
                     '"loras":[{"id":"watercolor","scale":0.3},{"id":"ink","scale":0.7}]}')


@dataclass(frozen=True)
class Example:
    name: str       # the constant in this module holding the command
    command: str
    test: str       # "module.py::function" (in tests/conformance) that runs it


#: In the spec's order.
EXAMPLES = [
    Example("STAGING", STAGING, "test_curl_examples.py::test_staging_example_stages_a_ready_variant"),
    Example("SEQUENCES", SEQUENCES, "test_curl_examples.py::test_sequences_example_streams_the_three_ids"),
    Example("TRANSCRIPTION_WAV", TRANSCRIPTION_WAV, "test_transcriptions_endpoint.py::test_spec_curl_examples"),
    Example("TRANSCRIPTION_PCM", TRANSCRIPTION_PCM, "test_transcriptions_endpoint.py::test_spec_curl_examples"),
    Example("INPUT_TOKENS", INPUT_TOKENS, "test_curl_examples.py::test_input_tokens_example_counts_the_prompt"),
]


def spec_curl_commands(text: str) -> list[str]:
    """The spec's curl commands, in order: each line that starts with `curl ` and the lines
    its trailing backslashes continue it with."""
    commands: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("curl "):
            block = [lines[i]]
            while block[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                block.append(lines[i])
            commands.append("\n".join(block))
        i += 1
    return commands


def local_command(command: str, port: int) -> str:
    """The command with its one spec address replaced by the test daemon's."""
    used = [url for url in SPEC_URLS if url in command]
    assert len(used) == 1, (used, command)
    return command.replace(used[0], f"http://127.0.0.1:{port}")


def run_example(command: str, port: int, directory: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the command through bash in `directory` (where its files are) against port `port`."""
    return subprocess.run(["bash", "-c", local_command(command, port)], cwd=directory, capture_output=True,
                          text=True, timeout=timeout)
