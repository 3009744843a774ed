"""A compare() variant's own process: ``python -m hybridnb.comparison.worker WIRING NAME``
(``processes.framed``), so whatever happens in it (an abort, a segfault, an allocation the OS
refuses, a GPU that never returns) ends this process, not the caller's: the caller makes it a row.

Its first request is its job (a cloudpickled ``session.Job``, its bytes sent as they are: a
``PACKED`` request), answered {"status": "ok"} once loaded; then it answers ``prepare`` and
``window`` (steps) with the session's plain dicts until ``close``, or until the caller goes away
(then it dies with it).
"""

from __future__ import annotations

import contextlib
import pickle
import sys
from typing import NoReturn

from hybridnb.processes.channel import ANSWER, Channel, Inbox
from hybridnb.processes.child import leave
from hybridnb.processes.framed import connect


def serve(channel: Channel, inbox: Inbox) -> None:
    """Load the job, then answer requests until ``close`` or until the caller closes its end."""
    from hybridnb.comparison.session import VariantSession

    first = inbox.get()
    if first is None:
        return
    session, broken = None, None
    try:
        session = VariantSession(pickle.loads(first.payload))
    except Exception as exc:  # noqa: BLE001 - a job this process cannot load becomes an answer
        broken = {"status": "failed", "note": f"the variant's process could not load its job: "
                                              f"{type(exc).__name__}: {exc}"}
    channel.send(ANSWER, broken or {"status": "ok"})
    while True:
        request = inbox.get()  # "prepare" or "window" (the caller sends no other)
        if request is None or request.kind == "close":
            return
        channel.send(ANSWER, broken or session.call(request.kind, *(request.payload or ())))


def main(argv: list[str] | None = None) -> NoReturn:
    channel, inbox, _ = connect(sys.argv[1:] if argv is None else argv)
    code = 0
    try:
        serve(channel, inbox)
    except BaseException:  # noqa: BLE001 - said on stderr, where the caller reads last words
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):  # exiting anyway
            channel.flush()
    leave(code)  # no interpreter teardown (about a second with torch loaded)


if __name__ == "__main__":
    sys.exit(main())
