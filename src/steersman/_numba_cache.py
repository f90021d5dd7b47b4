"""Numba's on-disk cache, keyed by the source of every compiled kernel.

Numba invalidates a cached function only when *its own* file changes: a kernel that
calls (and inlines) one from another file keeps running the callee's old machine code
after that file changed (numba issue #6845).  A cached ``fastpath.prediction_pass``
kept the previous ``kernels.predict_kernel`` that way.  So every module with compiled
kernels imports this module first: it points numba's cache at a directory named after
a hash of all of them, so changing any one recompiles all.  ``NUMBA_CACHE_DIR`` set by
the user wins; directories of other versions unused for a week are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numba

_KERNEL_FILES = ("policy/kernels.py", "policy/plugin_kernels.py", "policy/fastpath.py", "fleet/_prefix_table.py",
                 "text/_fast_tokenize.py", "text/_fast_hash.py", "policy/unprofiled_kernels.py",
                 "policy/shortlist_kernels.py", "fleet/_prefix_residency.py",
                 # not a kernel, but the kernels bake in its row numbers (S.KV_USAGE ...) as compile-time constants
                 "fleet/snapshot.py")
_KEEP_OTHERS_S = 7 * 24 * 3600.0


def cache_dir(root: Path | None = None) -> Path:
    """The cache directory for the kernel sources under ``root`` (the installed package by default)."""
    root = root or Path(__file__).resolve().parent
    h = hashlib.sha256()
    for rel in _KERNEL_FILES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "steersman" / "numba"
    return base / f"{numba.__version__}-{h.hexdigest()[:16]}"


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
    now = time.time()
    for other in d.parent.iterdir():
        try:
            if other != d and now - other.stat().st_mtime > _KEEP_OTHERS_S:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass


_configure()
