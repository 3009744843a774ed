"""The one supervisor of child processes (the GPU probe, compare()'s variants, the isolated fit,
``hn.launch``'s ranks): ``child`` starts and reaps them, ``supervise`` watches them, ``channel``
and ``framed`` carry their messages, ``payload`` packs what a spawned child is given. Of hybridnb
it imports only ``hybridnb.env`` and ``hybridnb.platform``; not torch or numpy.
"""

from hybridnb.processes.child import start_command, start_fork, start_spawn
from hybridnb.processes.ended import Ending
from hybridnb.processes.supervise import supervise
from hybridnb.processes.unsendable import NotSendable

__all__ = ["Ending", "NotSendable", "start_command", "start_fork", "start_spawn", "supervise"]
