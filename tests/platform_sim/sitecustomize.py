"""The platform lane: this interpreter, and every child it starts, without Linux's own facilities.

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that has one;
``tests/test_platform_lane.py`` puts this folder first on ``PYTHONPATH`` and sets
``HYBRIDNB_TEST_PLATFORM_SIM=1``, and both are inherited by every child (an isolated worker, a
probe, a compare() variant, a DataLoader worker), so in each of them the facilities macOS and
Windows lack are gone, the way they are gone there: the attributes do not exist, the library
call is not found, the folder is not there. Nothing in hybridnb is told.

Taken away: ``os.memfd_create``; ``os.fork`` (and multiprocessing's "fork" and "forkserver"
start methods: spawn is the default, as on macOS); ``prctl`` from libc (so no
PR_SET_PDEATHSIG); ``signal.SIGHUP``; ``os.waitid``, ``os.pidfd_open`` and
``os.sched_getaffinity`` (missing on macOS before Python 3.13); /proc, for hybridnb's code
(``os.path.exists``/``isdir`` say it is not there, and ``open`` of a path under it raises
FileNotFoundError when hybridnb calls it; psutil and torch keep theirs, as they have their own
means on macOS). Then the GPU simulation's (hybridnb_tools/gpu_sim), when it is on the path too.
"""

import os

SIM_ENV = "HYBRIDNB_TEST_PLATFORM_SIM"


def _take_away() -> None:
    import builtins
    import ctypes
    import signal
    import sys

    for name in ("memfd_create", "fork", "forkpty", "waitid", "pidfd_open", "sched_getaffinity"):
        if hasattr(os, name):
            delattr(os, name)
    if hasattr(signal, "SIGHUP"):
        del signal.SIGHUP

    import multiprocessing
    import multiprocessing.context as mp_context

    for method in ("fork", "forkserver"):
        mp_context._concrete_contexts.pop(method, None)
    mp_context._default_context._default_context = mp_context._concrete_contexts["spawn"]
    mp_context.DefaultContext.get_all_start_methods = lambda self: ["spawn"]
    multiprocessing.get_all_start_methods = lambda: ["spawn"]

    lookup = ctypes.CDLL.__getitem__

    def without_prctl(self, name_or_ordinal):
        if name_or_ordinal == "prctl":
            raise AttributeError(f"{name_or_ordinal}: not in this libc (tests/platform_sim)")
        return lookup(self, name_or_ordinal)

    ctypes.CDLL.__getitem__ = without_prctl

    def under_proc(path) -> bool:
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:  # a descriptor
            return False
        return text == "/proc" or text.startswith("/proc/")

    exists, isdir, opener = os.path.exists, os.path.isdir, builtins.open

    def no_proc_exists(path):
        return False if under_proc(path) else exists(path)

    def no_proc_isdir(path):
        return False if under_proc(path) else isdir(path)

    def no_proc_open(file, *args, **kwargs):
        if under_proc(file) and sys._getframe(1).f_globals.get("__name__", "").startswith(
                "hybridnb"):
            raise FileNotFoundError(2, "No such file or directory (tests/platform_sim)", file)
        return opener(file, *args, **kwargs)

    os.path.exists, os.path.isdir, builtins.open = no_proc_exists, no_proc_isdir, no_proc_open


if os.environ.get(SIM_ENV) == "1":
    _take_away()


from hybridnb_tools.gpu_sim.site_chain import run_the_next  # noqa: E402 - after this one's work

run_the_next(__file__)
