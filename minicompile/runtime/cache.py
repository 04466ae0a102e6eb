"""The on-disk cache: one directory, entries keyed by a hash of their source and flags.

An entry is written to a temporary name and renamed into place, with a checksum beside it;
an entry whose checksum does not match (truncated, corrupted) is rebuilt, never loaded. An
unwritable cache directory degrades to a temporary one, with one warning.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import warnings

log = logging.getLogger("minicompile")

from minicompile.config import config

class CacheRoot:
    """Resolves the cache directory: ``config.cache_dir`` while it is writable; otherwise one
    temporary directory for the rest of the process, announced by one warning."""

    def __init__(self):
        self.fallback: str | None = None
        self._lock = threading.Lock()

    def path(self) -> str:
        root = config.cache_dir
        try:
            os.makedirs(root, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=root, prefix=".probe", delete=True)
            probe.close()
            return root
        except OSError as e:
            with self._lock:
                if self.fallback is None:
                    self.fallback = tempfile.mkdtemp(prefix="minicompile-cache-")
                    warnings.warn(f"minicompile: cache directory {root!r} is not writable ({e.strerror}); "
                                  f"building in {self.fallback} instead. Set MINICOMPILE_CACHE_DIR to a writable "
                                  f"directory to keep compiled kernels between runs.", RuntimeWarning, stacklevel=4)
            return self.fallback


# The runtime's one resolver (tests swap in a fresh one).
root = CacheRoot()


def cache_root() -> str:
    """The usable cache directory (config.cache_dir, or a temporary one if unwritable)."""
    return root.path()


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:32]


def file_checksum(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_dir(kind: str, key: str) -> str:
    path = os.path.join(cache_root(), kind, key[:2], key)
    os.makedirs(path, exist_ok=True)
    return path


def is_valid(path: str) -> bool:
    """The artifact exists and matches the checksum written when it was built. An artifact that
    exists but does not match (truncated, corrupted, its checksum lost) is logged, to be rebuilt."""
    try:
        with open(path + ".sha256") as f:
            expected = f.read().strip()
        if expected == file_checksum(path):
            return True
    except OSError:
        pass
    if os.path.exists(path):
        log.warning("minicompile: cache entry %s does not match its checksum; rebuilding it", path)
    return False


def invalidate(path: str) -> None:
    """Forget an artifact that matched its checksum but cannot be used: the next build replaces it."""
    log.warning("minicompile: cache entry %s cannot be used; rebuilding it", path)
    try:
        os.remove(path + ".sha256")
    except OSError:
        pass


def commit(tmp_path: str, final_path: str) -> None:
    """Move a finished artifact into place, then record its checksum."""
    checksum = file_checksum(tmp_path)
    os.replace(tmp_path, final_path)
    tmp_sum = f"{final_path}.sha256.{os.getpid()}.{threading.get_ident()}"
    with open(tmp_sum, "w") as f:
        f.write(checksum)
    os.replace(tmp_sum, final_path + ".sha256")


def info() -> dict:
    root = cache_root()
    files, size = 0, 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            files += 1
            try:
                size += os.path.getsize(os.path.join(dirpath, n))
            except OSError:
                pass
    return {"path": root, "files": files, "bytes": size}


def clear() -> int:
    root = cache_root()
    n = info()["files"]
    for child in os.listdir(root):
        p = os.path.join(root, child)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.remove(p)
            except OSError:
                pass
    return n
