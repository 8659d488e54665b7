"""Generated numba modules: headers, content-addressed files written atomically, `loomc emit`."""

import re
from pathlib import Path


from click.testing import CliRunner

from loomc.check import load_files
from loomc.cli import main
from loomc.lower.kernels import lower_kernel
from loomc.lower.numba import default_cache_dir, load_group, module_path, render_module

SOURCE = ("config bias: f32 = 0.25\n\n// adds a bias\nkernel shift(x: f32[N], out y: f32[N]) {\n"
          "    parallel for i in 0..N {\n        y[i] = x[i] + bias\n    }\n}\n")


def group(tmp_path):
    path = tmp_path / "shift.loom"
    path.write_text(SOURCE)
    checked = load_files([path])
    info = checked.modules[0]
    return lower_kernel(checked.core, info, info.decls["shift"])


def test_module_text_names_its_source_and_is_self_contained(tmp_path):
    text = render_module(group(tmp_path))
    assert re.search(r"^# kernel shift: .*shift\.loom:4$", text, re.M)
    assert "# configs: bias = 0.25" in text
    assert '@njit(parallel=True, cache=True, fastmath=False, error_model="numpy")' in text
    assert "prange(" in text and "np.float32(0.25)" in text
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert all(re.match(r"(import (math|numpy as np)|from numba[\w.]* import )", line) for line in imports)
    compile(text, "generated", "exec")


def test_files_are_content_addressed_and_written_once(tmp_path):
    g = group(tmp_path)
    cache = tmp_path / "cache"
    (fn,) = load_group(g, cache)
    path = module_path(render_module(g), cache)
    assert path.parent == cache / "kernels" and re.fullmatch(r"k_[0-9a-f]{16}\.py", path.name)
    assert path.read_text() == render_module(g)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp_")]
    stamp = path.stat().st_mtime_ns
    (again,) = load_group(g, cache)
    assert again is fn and path.stat().st_mtime_ns == stamp  # numba's cache index keys on the file's stamp


def test_cache_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("LOOM_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "loom"


def test_emit_prints_the_cached_module_texts(repo):
    result = CliRunner().invoke(main, ["emit", "--target", "cpu", str(repo / "samples" / "scout" / "model.json")])
    assert result.exit_code == 0, result.output
    headers = re.findall(r"^# kernel (\w+): (\S+):(\d+)$", result.output, re.M)
    assert ("matmul_q4_1", "loomc/motifs/quant.loom", "22") in headers
    assert {"sample", "paged_attention", "rmsnorm", "embed_q8_0"} <= {h[0] for h in headers}
    assert result.output.count("@njit(parallel=True, cache=True, fastmath=False") >= len(headers)


def test_emit_filters_kernels_and_prints_ir(repo):
    motifs = str(repo / "loomc" / "motifs")
    result = CliRunner().invoke(main, ["emit", "--ir", "--kernel", "argmax", motifs])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("// loomc/motifs/sampling.loom:")
    assert "kernel argmax(logits: f32[R, V], out next: i32[R])" in result.output
    missing = CliRunner().invoke(main, ["emit", "--kernel", "nope", motifs])
    assert missing.exit_code == 1 and "no kernel named nope" in missing.output


def test_emit_reports_diagnostics_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.loom"
    bad.write_text("kernel k(x: f32[N]) {\n    parallel for i in 0..N {\n        x[i] = 1.0\n    }\n}\n")
    result = CliRunner().invoke(main, ["emit", str(bad)])
    assert result.exit_code == 1 and "L0305" in result.output and "Traceback" not in result.output
