"""The C heap of the daemon, once a minute (``soak.py --heap-log FILE`` puts this folder on PYTHONPATH).

Imported by every Python process started with this folder on ``PYTHONPATH``; it
acts only in the daemon (``appliance.daemon`` in its argv) and only when
``SOAK_HEAP_LOG`` names a file. A thread appends one line a minute: seconds
since start, RSS, and glibc's ``mallinfo2()``: the heap's size (``arena``,
main and thread arenas), what is in use in it (``inuse``), what is free inside
it (``free``), memory in separate mmaps (``mmap``), and CPython's allocated
block count. In-use memory that stays flat while ``free`` grows is memory the
allocator keeps (fragmentation), not live objects.
"""

import os
import sys

if os.environ.get("SOAK_HEAP_LOG") and "appliance.daemon" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    import ctypes
    import threading
    import time

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    def _log_heap(path: str) -> None:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        started = time.monotonic()
        mib = 2 ** 20
        while True:
            time.sleep(60)
            info = libc.mallinfo2()
            with open("/proc/self/statm") as statm:
                rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(path, "a") as out:
                out.write(f"{time.monotonic() - started:.0f} rss={rss / mib:.1f} arena={info.arena / mib:.1f} "
                          f"mmap={info.hblkhd / mib:.1f} inuse={info.uordblks / mib:.1f} free={info.fordblks / mib:.1f} "
                          f"pyblocks={sys.getallocatedblocks()} threads={threading.active_count()}\n")

    threading.Thread(target=_log_heap, args=(os.environ["SOAK_HEAP_LOG"],), daemon=True, name="heap-log").start()
