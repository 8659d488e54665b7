"""The spec's curl example for staging an uploaded candidate (http-profiles.md, "Uploaded source
packages"), run verbatim against a real `loomd` (only the URL's port differs).

The example's files are made real: `advance.loombc` is `loomc build` of the mini package's
kernels, and `config.loom` holds the candidate's commands (affine adds its bias twice), which
`use` the control/prepare providers by absolute server path and the kernels through the
package-relative `advance.loombc`. Together they are a complete native provider set.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from admin_http import ORIGINAL, absolute_uses, registrations
from loomd_process import REPO

#: Verbatim from the spec.
SPEC_COMMAND = """curl --fail-with-body -H 'Expect:' \\
  http://127.0.0.1:8080/v1/models/variants \\
  -F 'request=@candidate.json;type=application/json;filename=model/candidate.json' \\
  -F 'file=@config.loom;filename=model/config.loom' \\
  -F 'file=@advance.loombc;filename=model/advance.loombc'"""
SPEC = REPO.parent / "shared" / "spec" / "http-profiles.md"
SPEC_URL = "http://127.0.0.1:8080"

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


def run_example(daemon, directory: Path) -> subprocess.CompletedProcess:
    command = SPEC_COMMAND.replace(SPEC_URL, f"http://127.0.0.1:{daemon.port}")
    assert command != SPEC_COMMAND
    return subprocess.run(["bash", "-c", command], cwd=directory, capture_output=True, text=True, timeout=120)


def test_the_command_is_the_specs():
    assert shutil.which("curl"), "curl is not installed"
    if SPEC.is_file():                   # the spec lives beside the repository in this workspace
        assert SPEC_COMMAND in SPEC.read_text()


def test_staging_example_stages_a_ready_variant(daemon, tmp_path):
    before = inventory(daemon, "mini")
    prepare_files(tmp_path, "mini", before["selected"], config_loom())
    done = run_example(daemon, tmp_path)
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
    done = run_example(daemon, tmp_path)
    assert done.returncode == 22, (done.returncode, done.stdout, done.stderr)
    body = json.loads(done.stdout)
    v = body["variant"]
    assert v["phase"] == "failed" and v["error"]["code"] == "compile_error"
    assert any(d.startswith("model/config.loom:") for d in v["diagnostics"]), v["diagnostics"]
    assert inventory(daemon, "mini")["selected"] == before["selected"]
    assert daemon.request("POST", "/v1/models/variants/remove",
                          {"model": "mini", "variant": v["id"]}).json() == {"removed": v["id"]}
