"""Robustness: concurrent compiles, corrupted cache entries, an unwritable cache directory."""
from __future__ import annotations

import glob
import os
import threading
import time
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicompile.config import patch as config_patch
from minicompile.config import config
from minicompile.pipeline import compile_graph
from minicompile.runtime import cache, cpp_build


def _compile(fn, *inputs):
    return compile_graph(make_fx(fn, tracing_mode="fake")(*inputs), list(inputs))


def _fn(x, y):
    return (torch.exp(x) * y).sum(-1), torch.relu(x - y)


def _scaled(s):
    return lambda a, b: _fn(a * s, b)


def test_compiling_from_several_threads(tmp_path):
    x, y = torch.randn(6, 33), torch.randn(6, 33)
    expected = _fn(x, y)
    results, errors = [], []
    graphs = {s: make_fx(_scaled(s), tracing_mode="fake")(x, y) for s in (1.0, 2.0)}

    def work(k):
        try:
            # half the threads build the same graph (one build, shared), half a distinct one
            scale = float(k % 2 + 1)
            c = compile_graph(graphs[scale], [x, y])
            results.append((scale, c(x, y)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    with config_patch(cache_dir=str(tmp_path)):
        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(results) == 6
    for scale, out in results:
        ref = _fn(x * scale, y)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
    assert expected is not None


def _build_sources(cache_dir: str, count: int) -> None:
    with config_patch(cache_dir=cache_dir):
        for k in range(count):
            cpp_build.build(f'extern "C" void kernel0(float* out) {{ out[0] = {k}.0f; }}\n')


def test_processes_building_the_same_entries_at_once(tmp_path):
    # DDP ranks share one cache: each process writes its own temporary source and library and
    # renames them into place. A temporary name shared by all processes once made one rank's
    # rename fail (FileNotFoundError in the DDP test); the window is microseconds, so this
    # checks the multi-process path ends whole and tidy rather than reproducing that race.
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_sources, args=(str(tmp_path), 6)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    # the precompiled prelude is built by a process of its own (runtime/cpp_build.py), which
    # finishes and commits it after the process that started it ended
    for _ in range(600):
        if not glob.glob(str(tmp_path / "pch" / "**" / "*.tmp*"), recursive=True):
            break
        time.sleep(0.1)
    assert not glob.glob(str(tmp_path / "**" / "*.tmp"), recursive=True)


def test_a_forked_child_builds_in_the_background_too(tmp_path):
    """A build in the background (start_load: a training graph's backward while its forward
    builds) runs on a pool's thread; a child forked later (a DataLoader worker) has none of its
    parent's threads, and its own background builds must still run, not wait forever on an idle
    thread that is not there."""
    source = 'extern "C" void kernel0(float* out) {{ out[0] = {}.0f; }}\n'
    with config_patch(cache_dir=str(tmp_path)):
        building = cpp_build.start_load(source.format(7), {"kernel0": 1})
        building.result(timeout=120)   # its thread is idle: the child's pool would hand it the work
        pid = os.fork()
        if pid == 0:   # the child: exit status 0 if its build ran and its kernel wrote 8
            try:
                lib = cpp_build.start_load(source.format(8), {"kernel0": 1}).result(timeout=30)
                out = torch.zeros(1)
                lib.kernel0(out.data_ptr())
                os._exit(0 if out.item() == 8.0 else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        out = torch.zeros(1)
        building.result(timeout=120).kernel0(out.data_ptr())
    assert os.waitstatus_to_exitcode(status) == 0 and out.item() == 7.0


@pytest.mark.parametrize("threads", [1, 2])
def test_a_stopwatch_on_several_threads_waits_for_builds_in_the_background(threads):
    """g++ in the background (the precompiled prelude, a backward built beside its forward)
    holds a core: a library choice timed on several threads would wait at each barrier for it
    and keep the inflated answer on disk. On several threads the timing waits for the builds;
    on one (a core of its own) it does not."""
    from concurrent.futures import Future
    from minicompile.cpu import timing
    build, finished, calls = Future(), [], []
    cpp_build._background.add(build)
    threading.Timer(0.3, lambda: (finished.append(time.perf_counter()), build.set_result(None))).start()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        timing._interleaved_best({"routine": lambda: calls.append(time.perf_counter())})
    finally:
        torch.set_num_threads(before)
        build.result(timeout=5)
        cpp_build._background.discard(build)
    assert (min(calls) > finished[0]) == (threads > 1)


SOURCE = 'extern "C" void kernel0(float* out) { out[0] = 42.0f; }\n'


def _build_and_run(source=SOURCE):
    import ctypes
    path = cpp_build.build(source)
    lib = ctypes.CDLL(path)
    out = torch.zeros(1)
    lib.kernel0(ctypes.c_void_p(out.data_ptr()))
    return path, float(out[0])


# Damage is done to an entry this process has not loaded (as when another process, a full disk
# or a crash damaged it): rewriting a mapped library in place would crash the process itself.
@pytest.mark.parametrize("damage", ["truncate", "corrupt", "no-checksum"])
def test_damaged_cache_entry_is_rebuilt(tmp_path, damage, caplog):
    source = SOURCE + f"// {damage}\n"
    with config_patch(cache_dir=str(tmp_path)):
        lib = cpp_build.build(source)
        size = os.path.getsize(lib)
        if damage == "no-checksum":
            os.remove(lib + ".sha256")
        else:
            with open(lib, "r+b") as f:
                if damage == "truncate":
                    f.truncate(size // 2)
                else:
                    f.seek(size // 2)
                    f.write(b"\xde\xad\xbe\xef" * 16)
        with caplog.at_level("WARNING", logger="minicompile"):
            assert not cache.is_valid(lib)
        assert "does not match its checksum; rebuilding it" in caplog.text   # a rebuild is never silent
        path, value = _build_and_run(source)  # rebuilt, never loaded damaged
        assert path == lib and cache.is_valid(lib) and os.path.getsize(lib) == size
        assert value == 42.0


def test_cached_library_that_cannot_load_is_rebuilt_with_a_log_line(tmp_path, caplog):
    """A library whose checksum matches but which cannot be loaded (damaged with its checksum, or
    from another toolchain) is rebuilt once; a fresh one that still fails says to clear the cache."""
    source = SOURCE + "// unloadable\n"
    with config_patch(cache_dir=str(tmp_path)):
        lib = cpp_build.build(source)
        with open(lib, "wb") as f:
            f.write(b"not a shared library")
        with open(lib + ".sha256", "w") as f:
            f.write(cache.file_checksum(lib))      # the damage carries a matching checksum
        with caplog.at_level("WARNING", logger="minicompile"):
            loaded = cpp_build.load(source, {"kernel0": 1})
        assert "cannot be used; rebuilding it" in caplog.text and cache.is_valid(lib)
        out = torch.zeros(1)
        loaded.kernel0(out.data_ptr())
        assert float(out[0]) == 42.0
        with pytest.raises(cpp_build.CppCompileError, match="minicompile cache clear"):
            cpp_build.load(source, {"kernel0": 1, "no_such_kernel": 1})


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch):
    _unwritable_case(tmp_path, monkeypatch, make_readonly=True)


def test_cache_dir_that_cannot_exist_falls_back_with_one_warning(tmp_path, monkeypatch):
    # a path under a regular file cannot be created, even by root
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _unwritable_case(blocker / "cache", monkeypatch, make_readonly=False)


def _unwritable_case(path, monkeypatch, make_readonly):
    if make_readonly:
        os.chmod(path, 0o500)
    monkeypatch.setattr(cache, "root", cache.CacheRoot())   # one that has not fallen back yet
    try:
        x, y = torch.randn(2, 7), torch.randn(2, 7)
        with config_patch(cache_dir=str(path)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c1 = _compile(_fn, x, y)
            c2 = _compile(lambda a, b: _fn(a + 1, b), x, y)
        ours = [w for w in caught if "cache directory" in str(w.message)]
        assert len(ours) == 1, [str(w.message) for w in caught]
        assert "MINICOMPILE_CACHE_DIR" in str(ours[0].message)
        assert cache.root.fallback and os.path.isdir(cache.root.fallback)
        torch.testing.assert_close(c1(x, y)[0], _fn(x, y)[0])
        torch.testing.assert_close(c2(x, y)[1], _fn(x + 1, y)[1])
    finally:
        if make_readonly:
            os.chmod(path, 0o700)
    assert config.cache_dir != str(path)


def test_the_precompiled_prelude_is_built_in_the_background_used_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    """runtime/cpp_build.py: GCC reads the prelude precompiled once it is built; a damaged one is
    built again, never used; a build before it is ready reads the header itself."""
    import subprocess
    if "Free Software Foundation" not in cpp_build._compiler_version(cpp_build.compiler()):
        pytest.skip("precompiled headers are built for GCC only; this compiler reads the header itself")

    def built() -> str:
        monkeypatch.setattr(cpp_build, "_pch", {"started": False, "dir": None, "key": None})
        cpp_build.start_precompiled_prelude()
        for t in threading.enumerate():
            if t.name == "minicompile-pch":
                t.join()
        assert cpp_build._pch["dir"] is not None
        return os.path.join(cpp_build._pch["dir"], cpp_build.PRELUDE_HEADER + ".gch")
    with config_patch(cache_dir=str(tmp_path)):
        gch = built()
        assert cache.is_valid(gch)
        src = tmp_path / "unit.cpp"
        src.write_text(f'#include "{cpp_build.PRELUDE_HEADER}"\nextern "C" float kernel0(float x) {{ return std::exp(x); }}\n')
        flags = [f for f in cpp_build.CXXFLAGS if f != "-shared"]
        include = cpp_build._include_flags(cpp_build.compiler(), cpp_build._headers())
        shown = subprocess.run([cpp_build.compiler(), *flags, "-H", *include, "-c", str(src),
                                "-o", str(tmp_path / "unit.o")], capture_output=True, text=True)
        assert shown.returncode == 0 and f"! {gch}" in shown.stderr, shown.stderr[:2000]   # '!': used
        with open(gch, "r+b") as f:     # damaged: its checksum no longer matches, so it is built again
            f.truncate(1000)
        assert not cache.is_valid(gch)
        assert built() == gch and cache.is_valid(gch)
        x, y = torch.randn(6, 33), torch.randn(6, 33)
        for o, r in zip(_compile(_fn, x, y)(x, y), _fn(x, y)):
            torch.testing.assert_close(o, r)
