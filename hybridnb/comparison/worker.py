"""A compare() variant's own process: ``python -m hybridnb.comparison.worker JOB_FILE FD``.

It loads its job (a cloudpickled ``session.Job``), then answers the caller's requests over the
connection on file descriptor FD — ``("ready",)``, ``("prepare",)``, ``("window", steps)``,
``("close",)`` — with the session's plain-dict answers, until told to close or the caller goes
away. Whatever happens in here (an abort, a segfault, an allocation the OS refuses, a GPU that
never returns) ends this process, not the caller's: the caller turns it into a row.
"""

from __future__ import annotations

import pickle
import sys
from multiprocessing.connection import Connection

from hybridnb.comparison.session import VariantSession


def serve(job_file: str, conn: Connection) -> None:
    """Answer requests until ``close`` or until the caller closes its end."""
    try:
        with open(job_file, "rb") as f:
            session: VariantSession | None = VariantSession(pickle.load(f))
        broken = None
    except Exception as exc:  # noqa: BLE001 - a job this process cannot load becomes an answer
        session, broken = None, {"status": "failed", "note": f"the variant's process could not "
                                 f"load its job: {type(exc).__name__}: {exc}"}
    while True:
        try:
            name, *args = conn.recv()
        except EOFError:
            return
        if name == "close":
            conn.send({"status": "closed"})
            return
        if broken is not None:
            conn.send(broken)
        elif name == "ready":
            conn.send({"status": "ok"})
        else:
            conn.send(getattr(session, name)(*args))


def main(argv: list[str] | None = None) -> int:
    job_file, fd = argv if argv is not None else sys.argv[1:]
    serve(job_file, Connection(int(fd)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
