"""Compiling a deployment whose code arrived as an uploaded package: members are read from
the package (never from the disk), relative `use` stays inside it, diagnostics name members."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loomrt.compiler import build_deployment, compile_deployment
from loomrt.devices import Devices
from loomrt.document import parse_document
from loomrt.errors import CompileError
from loomrt.package import PackageFiles
from loomrt.registry import Registry
from loomrt.services.base import Job, Step
from mini_package import MINI, mini_weights


def mini_package(**replace: bytes) -> PackageFiles:
    files = {f"model/{p.name}": p.read_bytes() for p in MINI.glob("*.loom")}
    files.update(replace)
    return PackageFiles(files)


def document(checkpoint: str, **fields) -> str:
    doc = {"model": "packaged", "kind": "sequence", "control": "control.loom", "prepare": "prepare.loom",
           "sources": ["model.loom"], "checkpoint": checkpoint, "rows": 2, "context_length": 16}
    doc.update(fields)
    return json.dumps(doc)


def test_registration_compiles_and_serves_from_an_uploaded_package(tmp_path):
    path, w, b = mini_weights(tmp_path)
    registry = Registry(Devices(cuda={}))
    try:
        reg = registry.register(document(str(path)), package=mini_package(), origin="model/request.json")
        assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), 60), reg.phase
        assert reg.phase == "ready", reg.error
        x = np.arange(16, dtype=np.float32).reshape(2, 8) / 7
        out = registry.submit("packaged", Job([Step("affine", {"x": x})])).result(30)
        np.testing.assert_allclose(out[0]["y"], x @ w.T + b, rtol=1e-5, atol=1e-5)
    finally:
        registry.close()


def test_package_members_shadow_nothing_on_disk(tmp_path):
    """A member that is missing fails even when a file of that name exists beside the server's cwd."""
    files = dict(mini_package())
    del files["model/prepare.loom"]
    (tmp_path / "prepare.loom").write_text((MINI / "prepare.loom").read_text())
    with pytest.raises(Exception, match="not in the uploaded package"):
        parse_document(document("/x.safetensors"), package=PackageFiles(files), origin="model/request.json")


def test_relative_use_cannot_escape_the_package(tmp_path):
    bad = (MINI / "model.loom").read_text().replace('use "control.loom"', 'use "../../etc/control.loom"')
    doc = parse_document(document("/x.safetensors"), package=mini_package(**{"model/model.loom": bad.encode()}),
                         origin="model/request.json")
    with pytest.raises(CompileError) as info:
        build_deployment(doc, mini_package(**{"model/model.loom": bad.encode()}))
    assert "model/model.loom:1:5" in info.value.message
    assert "escapes the uploaded package's root" in info.value.message


def test_compile_error_in_a_member_names_member_line_and_column(tmp_path):
    bad = (MINI / "model.loom").read_text().replace("add_bias(y, b)", "add_bias(y, bias_missing)")
    package = mini_package(**{"model/model.loom": bad.encode()})
    doc = parse_document(document("/x.safetensors"), package=package, origin="model/request.json")
    with pytest.raises(CompileError) as info:
        compile_deployment(doc, package)
    line = next(i for i, text in enumerate(bad.splitlines(), 1) if "bias_missing" in text)
    assert f"model/model.loom:{line}:" in info.value.message
    assert "bias_missing" in info.value.message
    assert info.value.status == 422 and info.value.rendered()


def test_prepare_files_that_declare_another_type_of_a_used_param_are_refused(tmp_path):
    # model.loom `use`s prepare.loom's w (f32); the document prepares other.loom's w (f16): the
    # runtime binds prepared params by name, so this would run on the wrong storage
    other = (MINI / "prepare.loom").read_text().replace('param w: f32[dim, dim] = checkpoint("proj.weight")',
                                                        'param w: f16[dim, dim] = cast(checkpoint("proj.weight"), f16)')
    package = mini_package(**{"model/other.loom": other.encode()})
    doc = parse_document(document("/x.safetensors", prepare="other.loom"), package=package, origin="model/request.json")
    with pytest.raises(CompileError) as info:
        compile_deployment(doc, package)
    assert "model/other.loom:4:" in info.value.message
    assert ("reads param 'w' as f32[8, 8], but the prepare files declare f16[8, 8]: the sources `use` another "
            "declaration of it") in info.value.message
