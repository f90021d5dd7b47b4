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


_PROBE = """
import json, numba
from steersman.text import _fast_hash
_fast_hash.warm_up()
s = _fast_hash._chain.stats
print(json.dumps({"hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "dir": numba.config.CACHE_DIR}))
"""


def _probe(package_parent: Path, cache: Path, **env) -> dict:
    import json
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}, "PYTHONPATH": str(package_parent),
           "XDG_CACHE_HOME": str(cache), **env}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120,
                         cwd=package_parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_another_checkout_of_the_same_sources_loads_what_one_compiled(tmp_path):
    """numba names a kernel's cache folder by a hash of its source folder's absolute path: every clone (CI's fresh
    one, a benchmark's worktree of an older commit) compiled every kernel again, ~20-30 s in a process."""
    src = Path(steersman.__file__).resolve().parent
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    for name in ("a", "b"):
        shutil.copytree(src, tmp_path / name / "steersman", ignore=ignore)
    cache = tmp_path / "cache"
    first = _probe(tmp_path / "a", cache)
    assert first["misses"] == 1 and first["dir"].startswith(str(cache))  # compiled here, into the keyed directory
    again = _probe(tmp_path / "b", cache)  # the same sources at another path
    assert (again["hits"], again["misses"]) == (1, 0)
    assert _probe(tmp_path / "a", cache)["hits"] == 1
    # a kernel source that differs is another directory: compiled again, nothing stale loaded
    f = tmp_path / "b" / "steersman" / "text" / "_fast_hash.py"
    f.write_text(f.read_text() + "\n# changed\n")
    changed = _probe(tmp_path / "b", cache)
    assert changed["misses"] == 1 and changed["dir"] != first["dir"]
