"""The one supervisor of child processes (the GPU probe, compare()'s variants, the isolated fit,
``hn.launch``'s ranks): ``child`` starts, reads, kills and reaps them; ``supervise`` watches them
under one interrupt policy; ``channel`` and ``framed`` carry their messages; ``ended`` says how
they ended; ``payload``, ``refs``, ``loaders``, ``parametrized`` and ``unsendable`` pack what a
spawned child is given; ``spare`` keeps a warm worker; ``worker`` is its entry point.

Of hybridnb it imports only ``hybridnb.env`` and ``hybridnb.platform``; importing it does not
import torch or numpy.
"""

from hybridnb.processes.channel import Channel, Message
from hybridnb.processes.child import Child, start_command, start_fork, start_spawn
from hybridnb.processes.ended import ChildOutcome, Ending, Exit, signal_name
from hybridnb.processes.supervise import ChildProgress, Watch, Watched, supervise
from hybridnb.processes.unsendable import NotSendable

__all__ = ["Channel", "Child", "ChildOutcome", "ChildProgress", "Ending", "Exit", "Message",
           "NotSendable", "Watch", "Watched", "signal_name", "start_command", "start_fork",
           "start_spawn", "supervise"]
