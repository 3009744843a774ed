"""What a probe found: the steps, their titles, and one result per GPU (plain data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

EVENT = "probe"   # the kind of the child's messages: {"e": start|ok|fail|info|end, ...}
TITLES = {"import": "import torch", "available": "device available", "memory": "memory query",
          "tensor": "small tensor", "matmul": "matmul vs CPU", "copy_back": "copy back"}
STEPS = tuple(TITLES)  # in the order they run


@dataclass
class ProbeStep:
    name: str
    status: str              # "ok" | "failed" | "wrong" | "hung" | "crashed" | "not run"
    seconds: float | None = None
    detail: str = ""


@dataclass
class ProbeResult:
    """What one probe child did. ``verdict``: passed | failed | wrong result | hung | crashed.
    ``proven_at``: seconds since the epoch; ``cached``: read from ``probe.cache``."""

    backend: str
    index: int
    verdict: str
    steps: list[ProbeStep]
    seconds: float
    message: str = ""                 # one sentence for the report ("" when passed)
    failed_step: str | None = None
    info: dict = field(default_factory=dict)   # properties the child read from the device
    returncode: int | None = None
    proven_at: float | None = None
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_dict(cls, data: dict) -> ProbeResult:
        """The inverse of ``to_dict`` (unknown keys ignored)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["steps"] = [ProbeStep(**s) for s in data.get("steps", [])]
        return cls(**fields)
