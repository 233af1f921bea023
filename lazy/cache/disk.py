"""The persistent cache of compiled graphs: generated source + shared library, keyed by a stable digest.

Note [Disk cache entries]
The key is a sha256 of the graph's structure (op names, static arguments, dtypes, shapes, leaf layouts, input
positions, outputs), never Python's randomized ``hash()``, plus the backend, compiler command and flags, and
the torch/triton/lazy versions. An entry is ``<key>.so`` and ``<key>.json`` (sha256 of the library and of the
source it was built from), each written to a temp file and ``os.replace``d; the json is written last, so a
reader never sees half an entry. A reader checks the library's checksum and that the stored source equals the
source it just generated for this graph; any mismatch (truncated, corrupt, foreign) is counted as
``disk_cache.corrupt``, ignored and rebuilt. The directory is created 0700 and refused if another user owns it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import stat
import tempfile
import warnings
from typing import Any, Optional

import torch

from ..config import config
from ..debug import metrics
from ..ir.graph import Linearized
from ..ir.node import DATA

_REFUSED: set = set()


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    # NOTE: package metadata, not ``import triton`` (0.23 s, most of a warm cache hit in a fresh process)
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str, missing: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:  # triton is optional; lazy may run from a source tree
            return missing
    return f"torch={torch.__version__};triton={ver('triton', 'none')};lazy={ver('lazy', 'dev')};" \
        f"{platform.machine()};{platform.python_version()}"


def _enc(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ",".join(_enc(v) for v in value) + ")"
    if isinstance(value, float):
        return repr(value) + "f"
    return f"{type(value).__name__}:{value!r}"


def graph_digest(lin: Linearized, *salt: str) -> str:
    """A stable sha256 of the graph's structure (Note [Disk cache entries]); runtime scalars are not in it."""
    h = hashlib.sha256()
    for s in salt + (_versions(),):
        h.update(s.encode())
        h.update(b"\0")
    for node in lin.order:
        op = getattr(node.op, "name", None)
        op = str(node.op) if op is None or callable(op) else f"lazy.{op}"
        ins = ",".join(str(lin.positions[id(i)]) for i in node.inputs)
        layout = _enc(node.args) if node.op is not DATA else f"layout{node.args[0]}"
        h.update(f"{op}|{layout}|{_enc(node.kwargs)}|{node.shape}|{node.dtype}|{_enc(node.metas)}|{ins}\n".encode())
    h.update(f"out{lin.outputs}".encode())
    return h.hexdigest()


def cache_dir() -> Optional[str]:
    """The cache directory (created 0700), or None if disabled or refused (with one warning)."""
    path = config.cache_dir
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if path in _REFUSED:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        _refuse(path, f"it cannot be created ({e})")
        return None
    if st.st_uid != os.getuid():
        _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); loading shared libraries "
                      "from it would run another user's code")
        return None
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _refuse(path: str, why: str) -> None:
    _REFUSED.add(path)
    metrics.bump("disk_cache.refused")
    warnings.warn(f"lazy: not using the compile cache directory {path}: {why}. Set LAZY_CACHE_DIR to a directory "
                  "you own (or '' to disable the disk cache).", RuntimeWarning, stacklevel=3)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lookup(key: str, source: str) -> Optional[str]:
    """The path of a valid cached library for ``key`` built from exactly ``source``, or None (a miss)."""
    root = cache_dir()
    if root is None:
        return None
    meta_path, so_path = os.path.join(root, key + ".json"), os.path.join(root, key + ".so")
    if not os.path.exists(meta_path):
        metrics.bump("disk_cache.miss")
        return None
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        with open(so_path, "rb") as f:
            lib = f.read()
        ok = meta.get("so_sha256") == _sha(lib) and meta.get("source_sha256") == _sha(source.encode()) \
            and meta.get("key") == key
    except (OSError, ValueError, AttributeError):
        ok = False
    if not ok:
        metrics.bump("disk_cache.corrupt")
        metrics.bump("disk_cache.miss")
        return None
    metrics.bump("disk_cache.hit")
    return so_path


def store(key: str, source: str, so_file: str) -> Optional[str]:
    """Write an entry atomically; returns the cached library's path (None if the cache is disabled)."""
    root = cache_dir()
    if root is None:
        return None
    with open(so_file, "rb") as f:
        lib = f.read()
    meta = {"key": key, "so_sha256": _sha(lib), "source_sha256": _sha(source.encode()), "versions": _versions()}
    so_path = os.path.join(root, key + ".so")
    _atomic_write(os.path.join(root, key + ".cpp"), source.encode())
    _atomic_write(so_path, lib)
    _atomic_write(os.path.join(root, key + ".json"), json.dumps(meta).encode())
    metrics.bump("disk_cache.store")
    return so_path


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
