"""Shared test configuration: the suite runs from the repository root."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session", autouse=True)
def loom_cache_dir(tmp_path_factory):
    """One kernel cache for the whole run (generated modules and numba's compiled code beside
    them), so each kernel compiles once per session however many tests and programs use it."""
    path = tmp_path_factory.mktemp("loom-cache")
    previous = os.environ.get("LOOM_CACHE_DIR")
    os.environ["LOOM_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("LOOM_CACHE_DIR", None)
    else:
        os.environ["LOOM_CACHE_DIR"] = previous
