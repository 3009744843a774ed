"""Validate a GPU in a child process, step by step, under a hard timeout: ``child`` (the
steps), ``supervisor`` (the parent side and its results), ``cache`` (passed verdicts on disk).
"""

from hybridnb.hardware.probe.child import STEPS, TITLES
from hybridnb.hardware.probe.supervisor import DEFAULT_TIMEOUT, ProbeResult, ProbeStep, run_probes

__all__ = ["DEFAULT_TIMEOUT", "STEPS", "TITLES", "ProbeResult", "ProbeStep", "run_probes"]
