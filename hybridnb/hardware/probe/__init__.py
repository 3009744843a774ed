"""Validate a GPU in a child process, step by step, under a hard timeout.

- ``supervisor``: the parent side: one child per GPU in its own process group, watched together
  by ``processes.supervise.Watch`` under one deadline, the group killed and reaped at the
  deadline (``run_probes``);
- ``child``: the steps the child runs (``python -m hybridnb.hardware.probe WIRING --backend B
  --index N``, a framed command: its events travel in the channel's frames);
- ``cache``: passed verdicts on disk, per GPU, driver and torch build, for a bounded time;
- ``result``: the steps' names and the result types.
"""

from hybridnb.hardware.probe.result import STEPS, TITLES, ProbeResult, ProbeStep
from hybridnb.hardware.probe.supervisor import DEFAULT_TIMEOUT, run_probes

__all__ = ["DEFAULT_TIMEOUT", "STEPS", "TITLES", "ProbeResult", "ProbeStep", "run_probes"]
