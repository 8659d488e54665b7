"""loomc/runchecks.py: `loomc test`, the scout policy on the VM, and the worked example of docs §18."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from loomc.check.document import load_document
from loomc.cli import main
from loomc.lower.vm import compile_program
from loomc.run.errors import PolicyFailure
from loomc.run.vm import Vm

REPO = Path(__file__).resolve().parents[3]
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def invoke(*args: str):
    return CliRunner().invoke(main, ["test", *args])


# ---- loomc test ------------------------------------------------------------------------------


def test_the_scout_checks_pass():
    result = invoke(str(REPO / "samples" / "scout"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[-1] == "10 passed, 0 failed"
    assert all(line.startswith("ok ") and "control.loom::" in line for line in lines[:-1])
    assert any(line.endswith("::validate_sampling_normalises") for line in lines)
    assert any(line.endswith("::user_pieces_place_images_in_order") for line in lines)


@pytest.mark.parametrize("sample", ["encoder", "judge", "vectors"])
def test_every_samples_checks_pass(sample):
    result = invoke(str(REPO / "samples" / sample))
    assert result.exit_code == 0, result.output
    passed, failed = re.fullmatch(r"(\d+) passed, (\d+) failed", result.output.splitlines()[-1]).groups()
    assert int(passed) >= 1 and failed == "0", result.output


FAILING = """fn double(x: int) -> int {
    return x * 2
}

check passes {
    expect double(21) == 42
}

check compares {
    let n = 3
    expect double(n) == 7
}

check plain {
    expect double(1) > 5 || false
}

check crashes {
    let m = {"a": 1}
    expect m["b"] == 1
}

check rejects {
    fail(400, "nope")
}

check spins {
    while true {}
}
"""


def test_failures_name_the_check_and_the_position(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("t.loom").write_text(FAILING, encoding="utf-8")
    result = invoke("t.loom", "--budget", "1000")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "ok t.loom::passes",
        "FAIL t.loom::compares: t.loom:11:5: expect failed: double(n) == 7 (left: 6, right: 7)",
        "FAIL t.loom::plain: t.loom:15:5: expect failed: double(1) > 5 || false",
        'FAIL t.loom::crashes: t.loom:20:14: key "b" is not in the map (use has(m, key) first)',
        "FAIL t.loom::rejects: t.loom:24:5: fail(400, 'nope')",
        "FAIL t.loom::spins: t.loom:28:5: instruction budget of 1000 used up (a loop that never ends?)",
        "1 passed, 5 failed",
    ]


def test_an_error_inside_a_called_fn_names_the_check_that_called_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("t.loom").write_text("fn first(xs: list) -> any {\n    return xs[0]\n}\n\ncheck empty {\n"
                              "    expect first([]) == null\n}\n", encoding="utf-8")
    result = invoke("t.loom")
    assert result.output.splitlines()[0] == ("FAIL t.loom::empty: t.loom:2:15: index 0 is out of range for a list of "
                                             "length 0 (called from t.loom:6:12 in check empty)")


def test_a_file_that_does_not_check_reports_diagnostics_and_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bad.loom").write_text("check c {\n    expect 1\n}\n", encoding="utf-8")
    result = invoke("bad.loom")
    assert result.exit_code == 1
    assert "bad.loom:2:12: error[L0308]" in result.output and result.output.splitlines()[-1] == "0 passed, 0 failed"
    assert invoke("missing.loom").exit_code == 1


def test_documents_run_first_with_their_overrides_and_checks_run_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("c.loom").write_text("config limit: i64 = 4\n\ncheck limit_is_nine {\n    expect limit == 9\n}\n",
                              encoding="utf-8")
    Path("model.json").write_text(json.dumps({"model": "m", "kind": "text", "control": "c.loom",
                                              "config": {"limit": 9}}), encoding="utf-8")
    result = invoke(".")  # the folder holds both the document and c.loom
    assert result.output.splitlines() == ["ok c.loom::limit_is_nine", "1 passed, 0 failed"]
    assert invoke("c.loom").exit_code == 1  # without the document the config is 4


def test_files_reached_only_through_use_are_not_tested(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("lib.loom").write_text("fn one() -> int {\n    return 1\n}\n\ncheck lib_fails {\n    expect one() == 2\n}\n",
                                encoding="utf-8")
    Path("app.loom").write_text('use "lib.loom" { one }\n\ncheck app_ok {\n    expect one() == 1\n}\n',
                                encoding="utf-8")
    result = invoke("app.loom")
    assert result.exit_code == 0 and result.output.splitlines() == ["ok app.loom::app_ok", "1 passed, 0 failed"]


def test_the_worked_example_of_section_18_passes(tmp_path, monkeypatch):
    text = (REPO / "docs" / "language.md").read_text(encoding="utf-8")
    section = text[text.index("## 18. The control VM"):]
    (example,) = re.findall(r"^```loom\n(.*?)^```", section, re.M | re.S)
    monkeypatch.chdir(tmp_path)
    Path("demo.loom").write_text(example, encoding="utf-8")
    result = invoke("demo.loom")
    assert result.exit_code == 0, result.output


# ---- the scout policy on the VM ------------------------------------------------------------------


@pytest.fixture(scope="module")
def scout() -> Vm:
    return Vm(compile_program(load_document(REPO / "samples" / "scout" / "model.json")))


def test_scout_renders_chatml_with_the_default_system_prompt(scout):
    request = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    assert scout.call("render", [request]) == (
        SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n")


def test_scout_renders_chatml_with_its_own_system_prompt(scout):
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]
    request = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]}
    assert scout.call("render", [request]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("request_, message", [
    ({}, "'messages' must be a non-empty list"),
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"messages": [{"content": "x"}]}, "every message needs a string 'role'"),
    ({"messages": [{"role": "user", "content": 3}]}, "'content' must be a string or a list of text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "'content' parts must be text or image_url"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url"}]}]}, "only user messages may hold images"),
])
def test_scout_render_rejects_bad_messages(scout, request_, message):
    with pytest.raises(PolicyFailure) as info:
        scout.call("render", [request_])
    assert info.value.status == 400 and info.value.message.startswith(message)


def test_scout_validate_sampling(scout):
    assert scout.call("validate_sampling", [{}]) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None}
    assert scout.call("validate_sampling", [{"temperature": 0, "top_p": 0.5, "top_k": 64, "seed": -2}]) == \
        {"temperature": 0.0, "top_p": 0.5, "top_k": 64, "seed": 2 ** 64 - 2}
    got = scout.call("validate_sampling", [{"temperature": 2, "seed": 2 ** 64 - 1}])
    assert type(got["temperature"]) is float and got["seed"] == 2 ** 64 - 1
    for request, message in [({"temperature": 2.5}, "'temperature' must be between 0 and 2, got 2.5"),
                             ({"temperature": "hot"}, "'temperature' must be a number between 0 and 2"),
                             ({"top_p": 0}, "'top_p' must be greater than 0 and at most 1, got 0"),
                             ({"top_k": 65}, "'top_k' must be between 0 and 64, got 65"),
                             ({"top_k": 1.0}, "'top_k' must be an integer between 0 and 64"),
                             ({"seed": 2 ** 64}, "'seed' must fit in 64 bits, got 18446744073709551616"),
                             ({"seed": True}, "'seed' must be an integer")]:
        with pytest.raises(PolicyFailure) as info:
            scout.call("validate_sampling", [request])
        assert (info.value.status, info.value.message) == (400, message)
    assert scout.call("stop_token_ids", []) == [2, 0]
