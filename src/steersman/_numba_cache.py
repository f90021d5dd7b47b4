"""Numba's on-disk cache, keyed by the source of every compiled kernel.

Numba invalidates a cached function only when *its own* file changes: a kernel that
calls (and inlines) one from another file keeps running the callee's old machine code
after that file changed (numba issue #6845).  A cached ``fastpath.prediction_pass``
kept the previous ``kernels.predict_kernel`` that way.  So every module with compiled
kernels imports this module first: it points numba's cache at a directory named after
a hash of all of them, so changing any one recompiles all.  ``NUMBA_CACHE_DIR`` set by
the user wins; directories of other versions unused for a week are removed.

Inside that directory a kernel's files sit under its package-relative folder (``policy/``), not under
numba's default name for it, a hash of the folder's absolute path: the directory is already keyed by the
kernels' content (and numba stamps each file by its content), so another checkout of the same sources (a
fresh clone in CI, a worktree of an older commit for a benchmark) loads what this one compiled instead of
compiling every kernel again (~20-30 s of CPU a process that starts first).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numba
from numba.core.caching import CacheImpl, UserProvidedCacheLocator

_KERNEL_FILES = ("policy/kernels.py", "policy/plugin_kernels.py", "policy/fastpath.py", "fleet/_prefix_table.py",
                 "text/_fast_tokenize.py", "text/_fast_hash.py", "policy/unprofiled_kernels.py",
                 "policy/shortlist_kernels.py", "fleet/_prefix_residency.py",
                 # not a kernel, but the kernels bake in its row numbers (S.KV_USAGE ...) as compile-time constants
                 "fleet/snapshot.py")
_KEEP_OTHERS_S = 7 * 24 * 3600.0
_ROOT = Path(__file__).resolve().parent


def cache_dir(root: Path | None = None) -> Path:
    """The cache directory for the kernel sources under ``root`` (the installed package by default)."""
    root = root or Path(__file__).resolve().parent
    h = hashlib.sha256()
    for rel in _KERNEL_FILES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "steersman" / "numba"
    return base / f"{numba.__version__}-{h.hexdigest()[:16]}"


class PackageCacheLocator(UserProvidedCacheLocator):
    """Numba's locator for a chosen cache directory, with the kernel's package-relative folder as its subpath
    (numba's: a hash of the folder's absolute path, so every checkout compiled its own copy).  Installed only when
    this module chose the cache directory, and only for this package's files: anything else falls through to
    numba's own locators."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        rel = Path(py_file).resolve().parent.relative_to(_ROOT)
        self._cache_path = os.path.join(numba.config.CACHE_DIR, "steersman", *rel.parts)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not numba.config.CACHE_DIR or not Path(py_file).resolve().is_relative_to(_ROOT):
            return None
        return super().from_function(py_func, py_file)


def _configure() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        os.utime(d)
    except OSError:
        return  # not writable: numba's default (beside the sources) applies
    numba.config.CACHE_DIR = str(d)
    if not numba.config.CACHE_LOCATOR_CLASSES:  # the user's NUMBA_CACHE_LOCATOR_CLASSES wins
        numba.config.CACHE_LOCATOR_CLASSES = ",".join(  # ours, then numba's own in its order
            [f"{__name__}.PackageCacheLocator"] + [k.__name__ for k in CacheImpl._locator_classes])
    now = time.time()
    for other in d.parent.iterdir():
        try:
            if other != d and now - other.stat().st_mtime > _KEEP_OTHERS_S:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass


_configure()
