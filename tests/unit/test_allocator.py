"""The daemon's allocator switch: the environment across the re-exec, and where the library is looked for."""

from __future__ import annotations

from pathlib import Path

from appliance.allocator import (
    JEMALLOC_OPTIONS,
    LIBRARY,
    SAVED_CONF,
    SAVED_PRELOAD,
    find_jemalloc,
    jemalloc_loaded,
    preload_environment,
    restore_preload,
)


def test_the_preload_is_put_first_and_given_back_as_it_was() -> None:
    lib = Path("/usr/lib/x86_64-linux-gnu") / LIBRARY
    env = preload_environment(lib, {"PATH": "/bin"})
    assert env["LD_PRELOAD"] == str(lib) and env[SAVED_PRELOAD] == "" and env["PATH"] == "/bin"
    assert env["MALLOC_CONF"] == JEMALLOC_OPTIONS == "background_thread:true"
    restore_preload(env)
    assert env == {"PATH": "/bin"}  # both were unset: the engines get neither

    env = preload_environment(lib, {"LD_PRELOAD": "/opt/trace.so", "MALLOC_CONF": "background_thread:false,narenas:2"})
    assert env["LD_PRELOAD"] == f"{lib}:/opt/trace.so"
    # The operator's options come after the daemon's: jemalloc reads them in order, so theirs win.
    assert env["MALLOC_CONF"] == "background_thread:true,background_thread:false,narenas:2"
    restore_preload(env)
    # The operator's own preload and options are kept for the engines.
    assert env == {"LD_PRELOAD": "/opt/trace.so", "MALLOC_CONF": "background_thread:false,narenas:2"}
    assert SAVED_CONF not in env


def test_restoring_without_a_re_exec_changes_nothing() -> None:
    env = {"LD_PRELOAD": "/opt/trace.so"}
    restore_preload(env)
    assert env == {"LD_PRELOAD": "/opt/trace.so"}


def test_the_library_is_found_in_the_first_folder_that_has_it(tmp_path: Path) -> None:
    empty, first, second = (tmp_path / n for n in ("empty", "first", "second"))
    for folder in (empty, first, second):
        folder.mkdir()
    (first / LIBRARY).write_bytes(b"")
    (second / LIBRARY).write_bytes(b"")
    assert find_jemalloc((str(empty), str(first), str(second))) == first / LIBRARY
    assert find_jemalloc((str(empty),)) is None


def test_a_mapped_library_is_seen_in_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/{LIBRARY}\n")
    assert jemalloc_loaded(maps)
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert not jemalloc_loaded(maps)
    assert not jemalloc_loaded(tmp_path / "missing")
