"""The one supervisor of child processes: start, messages and output, heartbeats with a silence
limit, process-group kill, and how it ended. Used by the GPU probe, compare()'s variants, the
isolated fit and ``hn.launch``'s ranks.

- ``child``: start a child (``start_fork``, ``start_spawn``: a fresh interpreter running a
  cloudpickled callable, ``start_command``), read its output, kill its process group, reap it;
  the only module of hybridnb that sends signals;
- ``supervise``: the one watch loop, ``Watch`` (several children at once: messages, output,
  heartbeats naming the phase, the silence limit, a deadline, stop requests) and the one
  interrupt policy (SIGINT and SIGTERM ask the children to stop, a grace, then their groups are
  killed; a second signal kills at once); ``supervise`` watches one child;
- ``framed``: a command (``python -m MODULE``) that talks in the channel's frames, with a
  request pipe the other way (the GPU probe, compare()'s variants);
- ``ended``: ``Ending`` (the kinds of ending, a str enum), ``Exit``, ``ChildOutcome``;
- ``channel``: framed messages between child and parent (tensors as raw bytes), ``StopFlag``
  (which says why a stop was asked: "stop" or "interrupt");
- ``payload``: what a spawned child is given (cloudpickle; memory-mapped data by reference
  (``refs``), other big CPU tensors and arrays through shared memory (a temporary folder where
  /dev/shm is small or full), DataLoaders rebuilt (``loaders``), parametrized modules with
  their state (``parametrized``), an object that cannot be sent named (``unsendable``:
  ``NotSendable``));
- ``spare``: the warm worker, one spare prestarted worker kept for the next ``prestart_spawn``
  (``HYBRIDNB_WARM_WORKER=0`` turns it off);
- ``output``: a child's output lines and its last words;
- ``worker``: the spawned child's entry point (``python -m hybridnb.processes.worker``).

This floor sits low: of hybridnb it imports only ``hybridnb.env``. Importing it does not
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
