"""Numba's cache is keyed by every kernel source: changing one kernel file recompiles the kernels of the
others that inline it (numba alone keys a function's cache by its own file only)."""

import os
import shutil
from pathlib import Path

import numba
import pytest

import steersman
from steersman import _numba_cache as nc


def test_the_cache_directory_follows_every_kernel_source(tmp_path):
    src = Path(steersman.__file__).resolve().parent
    for rel in nc._KERNEL_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, tmp_path / rel)
    same = nc.cache_dir(tmp_path)
    assert same == nc.cache_dir(src)
    for rel in nc._KERNEL_FILES:
        f = tmp_path / rel
        f.write_text(f.read_text() + "\n# changed\n")
        assert nc.cache_dir(tmp_path) != same, rel  # any one of them moves the cache
        f.write_text(f.read_text().removesuffix("\n# changed\n"))
    assert nc.cache_dir(tmp_path) == same


@pytest.mark.skipif(bool(os.environ.get("NUMBA_CACHE_DIR")), reason="the user chose the cache directory")
def test_the_kernels_compile_into_it():
    import steersman.policy.fastpath  # noqa: F401  (compiles or loads the kernels)

    assert numba.config.CACHE_DIR == str(nc.cache_dir())


def test_every_module_with_compiled_kernels_keys_the_cache():
    """A kernel file left out of the list would keep its callers' stale inlined copies after it changes."""
    src = Path(steersman.__file__).resolve().parent
    compiled = {p.relative_to(src).as_posix() for p in src.rglob("*.py") if "@njit" in p.read_text()}
    # and the snapshot's row numbers, which the kernels read as constants (renumbering them kept stale kernels)
    assert compiled | {"fleet/snapshot.py"} == set(nc._KERNEL_FILES)
