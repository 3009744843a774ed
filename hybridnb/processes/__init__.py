"""The one supervisor of child processes (the GPU probe, compare()'s variants, the isolated fit,
``hn.launch``'s ranks): ``child`` starts and reaps them, ``supervise`` watches them, ``channel``
and ``framed`` carry their messages, ``payload`` packs what a spawned child is given.

Of hybridnb it imports only ``hybridnb.env`` and ``hybridnb.platform``; not torch or numpy.
"""

from hybridnb.processes.channel import Channel, Message
from hybridnb.processes.child import Child, start_command, start_fork, start_spawn
from hybridnb.processes.ended import ChildOutcome, Ending, Exit, signal_name
from hybridnb.processes.supervise import ChildProgress, Watch, Watched, supervise
from hybridnb.processes.unsendable import NotSendable

__all__ = ["Channel", "Child", "ChildOutcome", "ChildProgress", "Ending", "Exit", "Message",
           "NotSendable", "Watch", "Watched", "signal_name", "start_command", "start_fork",
           "start_spawn", "supervise"]
