"""Validate a GPU in a child process, step by step, under a hard timeout: ``supervisor`` (the
parent side), ``child`` (the steps), ``cache`` (passed verdicts on disk), ``result`` (the types).
"""

from hybridnb.hardware.probe.result import STEPS, TITLES, ProbeResult, ProbeStep
from hybridnb.hardware.probe.supervisor import DEFAULT_TIMEOUT, run_probes

__all__ = ["DEFAULT_TIMEOUT", "STEPS", "TITLES", "ProbeResult", "ProbeStep", "run_probes"]
