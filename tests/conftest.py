import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    assert SHARED.is_dir(), f"{SHARED} (the shared data beside the project) is missing"
    return SHARED
