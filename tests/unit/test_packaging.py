"""A non-editable install works: a wheel of the project, installed into a fresh venv, parses and
checks `.loom` (grammar and motifs are package data) with the source checkout out of sight.

Offline and in seconds: the wheel is built without build isolation (setuptools from the test
environment, see the `test` extra) from a copy of the files the build reads (so nothing is
written into the checkout: no `build/`, no refreshed `*.egg-info`), installed with `--no-deps`
into a venv without pip, and the project's dependencies come from this environment's
site-packages through a `.pth` line. Python adds that folder to `sys.path` but does not process
the `.pth` files inside it, so the editable install's finder (which maps `loomc` to the
checkout) stays inactive and `import loomc` can only find the installed wheel.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT_S = 300   # one subprocess; a hang guard, each takes seconds


def run(cmd: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)


def build_inputs(dest: Path) -> Path:
    """Copy what `pip wheel .` reads (pyproject, readme, the packages it finds) into `dest`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    dest.mkdir()
    shutil.copy2(REPO / "pyproject.toml", dest)
    shutil.copy2(REPO / project["project"]["readme"], dest)
    for top in sorted(REPO.iterdir()):
        if top.is_dir() and any(fnmatch.fnmatch(top.name, p) for p in patterns):
            shutil.copytree(top, dest / top.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(fresh venv, work dir outside the checkout, environment for its commands)."""
    tmp = tmp_path_factory.mktemp("packaging")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                                                           "LOOM_SAMPLES", "VIRTUAL_ENV")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", PIP_NO_INPUT="1", PYTHONNOUSERSITE="1")
    pip = [sys.executable, "-m", "pip"]

    wheels = tmp / "wheels"
    done = run([*pip, "wheel", build_inputs(tmp / "src"), "--no-deps", "--no-build-isolation", "-w", wheels],
               tmp, env)
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = wheels.glob("loom-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "loomc/grammar/loom.lark" in names
    assert {"loomc/motifs/norms.loom", "loomc/motifs/attention.loom"} <= names
    assert {"loomd/ui/index.html", "loomd/ui/status.js", "loomd/ui/status.css"} <= names

    venv = tmp / "venv"
    done = run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, env)
    assert done.returncode == 0, done.stdout + done.stderr
    python = venv / "bin" / "python"
    done = run([*pip, "--python", python, "install", "--no-deps", "--quiet", wheel], tmp, env)
    assert done.returncode == 0, done.stdout + done.stderr

    # The dependencies (lark, numba, click, ...): this environment's site-packages, without its .pth files.
    fresh_site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          tmp, env).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (fresh_site / "loom-test-deps.pth").write_text("".join(f"{p}\n" for p in ours), encoding="utf-8")

    work = tmp / "work"
    work.mkdir()
    return venv, work, env


def test_the_installed_packages_are_imported_from_the_fresh_venv_not_the_checkout(installed):
    venv, work, env = installed
    done = run([venv / "bin" / "python", "-c",
                "import loomc, loomd, loomrt\n"
                "from loomc.syntax.parse import GRAMMAR_PATH\n"
                "for f in (loomc.__file__, loomd.__file__, loomrt.__file__, GRAMMAR_PATH): print(f)"],
               work, env)
    assert done.returncode == 0, done.stderr
    paths = [Path(line).resolve() for line in done.stdout.split()]
    assert len(paths) == 4
    for path in paths:
        assert path.is_relative_to(venv.resolve()), path
        assert not path.is_relative_to(REPO), path


def test_the_installed_loomc_checks_samples_copied_outside_the_checkout(installed):
    venv, work, env = installed
    samples = work / "copied" / "samples"
    shutil.copytree(REPO / "samples", samples)   # the whole folder: encoder and judge use ../scout/
    done = run([venv / "bin" / "loomc", "check", samples, samples / "encoder" / "model.json"], work, env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_installed_loomd_serve_without_documents_or_samples_says_where_it_looked(installed):
    venv, work, env = installed
    done = run([venv / "bin" / "loomd", "serve"], work, env)
    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "--samples DIR" in message and "LOOM_SAMPLES" in message and "loomd serve DOC.json" in message
