"""Large blocks get their own mappings even after a bigger one was freed (glibc's moving threshold is fixed)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import ctypes, json, sys
from appliance.heap import map_large_blocks

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "fixed":
    assert map_large_blocks()
big = libc.malloc(8 << 20)   # mapped, then freed: glibc raises its threshold to 8 MiB unless it was fixed
libc.free(big)
before = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
after = libc.mallinfo2().hblkhd
libc.free(block)
print(json.dumps({"mapped_growth": after - before}))
"""


def _mapped_growth(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["mapped_growth"]


def test_a_one_mib_block_is_mapped_after_an_eight_mib_one_was_freed():
    assert _mapped_growth("default") == 0  # glibc's default: carved from the heap, leaving a hole when freed
    assert _mapped_growth("fixed") >= 1 << 20


TRIM_PROBE = r"""
import ctypes, json, os, sys
from appliance.heap import release_free_memory

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

blocks, pins = [], []
for _ in range(5000):                                 # 80 MB of 16 kB blocks from the heap, each followed by
    blocks.append(libc.malloc(16000))                 # a small block that stays: every hole a freed one leaves
    libc.memset(blocks[-1], 1, 16000)                 # is pinned, as a daemon's long-lived objects pin them
    pins.append(libc.malloc(64))
for b in blocks:
    libc.free(b)
before = rss()
if sys.argv[1] == "trim":
    assert release_free_memory()
print(json.dumps({"released": before - rss()}))
"""


def _released(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE, mode], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["released"]


def test_free_pages_in_the_middle_of_the_heap_go_back_to_the_system_when_released():
    assert _released("keep") < 8 << 20  # free() alone keeps a hole below a live block
    assert _released("trim") > 40 << 20  # the whole pages inside the 16 kB holes
