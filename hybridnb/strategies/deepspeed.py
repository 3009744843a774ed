"""``strategy="deepspeed"``: ZeRO-2 through DeepSpeed's own engine, driven by the Trainer.

ZeRO-2 splits the optimizer state and the gradients over the ranks (4 GPUs hold a quarter of the
Adam moments each); everything else works as under DDP. The engine owns backward, clipping and
the optimizer step (the Trainer sets the learning rate). It reduces gradients *inside* backward,
so the ranks agree before each micro-batch's backward (``backward``): an out-of-memory error in
a forward is still split on every rank, one inside backward stops the job (the others wait in
the reduction; the last checkpoint stays on disk). Resuming needs the same number of ranks:
rank 0's ``last.pt`` holds every rank's optimizer partition (``for_file``).
"""

from __future__ import annotations

import importlib.util
import math
import os
from unittest import mock

import torch
import torch.distributed as dist

from hybridnb import failures
from hybridnb.strategies.ddp import DDPStrategy, _Agreed, vote

MISSING = ("strategy='deepspeed' needs the deepspeed package, which is not installed: pip install "
           "deepspeed (Linux with a compiler; see deepspeed.ai). For EEG-sized models "
           "strategy='ddp' trains just as fast: ZeRO-2 saves optimizer and gradient memory that "
           "these models do not need.")
_SHM_OP = "deepspeed_shm_comm"  # its shared-memory all-reduce (ShareMemCommBuilder)


def available() -> bool:
    """Whether ``import deepspeed`` would find the package (without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


class BackwardFailure(Exception, _Agreed):
    """A rank failed inside ZeRO-2's backward, where the ranks cannot agree on a retry."""


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (_merge(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out


class DeepSpeedStrategy(DDPStrategy):
    """One rank of a DeepSpeed ZeRO-2 job. ``config`` is merged over the config the Trainer
    builds, e.g. ``{"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}``."""

    name = "deepspeed"
    owns_update = True
    # bf16 is the Trainer's autocast over fp32 master weights; fp16 would need DeepSpeed's own
    # loss scaler, which hybridnb does not drive; the engine wraps the eager model: no compile
    supported_precisions = ("fp32", "bf16")
    supports_compile = False

    def __init__(self, device: torch.device | str = "auto", config: dict | None = None) -> None:
        if not available():
            raise ImportError(MISSING)
        super().__init__(device)
        if self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported
        self.user_config = dict(config or {})
        self.config: dict | None = None
        self.engine = None
        self._dirty = False  # gradients of this attempt were already reduced into ZeRO's buffers

    def configure(self, batch_size: int, clip_grad: float | None) -> None:
        """DeepSpeed's config from the Trainer's batch size and clipping, under the user's."""
        self.config = _merge({
            "train_micro_batch_size_per_gpu": int(batch_size),
            "gradient_accumulation_steps": 1,  # the Trainer marks each window's last micro-batch
            "gradient_clipping": float(clip_grad or 0.0),
            "zero_optimization": {"stage": 2},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**31 - 1,
        }, self.user_config)
        stage = self.config["zero_optimization"].get("stage")
        if stage not in (1, 2):
            raise ValueError(f"DeepSpeed config zero_optimization.stage={stage!r}: hybridnb drives "
                             "ZeRO stages 1 and 2 (stage 3 shards the weights themselves, which "
                             "EEG-sized models never need)")

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """DeepSpeed's engine around ``model`` and the Trainer's optimizer (built once)."""
        if self.engine is None:
            import deepspeed

            self._module = model
            # its shared-memory all-reduce serves tensor-parallel inference only: building it
            # compiles C++ for 25-37 s on a first CPU run (and needs a compiler), never used here
            with mock.patch.dict(deepspeed.ops.__compatible_ops__, {_SHM_OP: False}):
                self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                       config=self.config,
                                                       dist_init_required=False)
        return self.engine

    def micro_plan(self, pieces: int, samples: int) -> tuple[int, float]:
        """As many micro-batches as the rank with the most (ZeRO reduces in each backward), the
        loss weighed by this rank's share of the global batch: the engine's equal-weight mean
        over ranks is then the mean over all samples, as on one device."""
        mine = torch.tensor([pieces, samples], dtype=torch.int64, device=self._comm)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        counts = torch.stack(every).cpu()
        total = int(counts[:, 1].sum())
        return int(counts[:, 0].max()), (self.world_size * samples / total if total else 1.0)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Agree that every rank's forward succeeded, then ``engine.backward`` (the step calls
        this, not the loss's backward, because the engine ``owns_update``)."""
        self._vote(None)
        self.engine.set_gradient_accumulation_boundary(last)
        self._dirty = True
        try:
            self.engine.backward(loss, scale_wrt_gas=False)
        except Exception as exc:  # noqa: BLE001 - DeepSpeed's errors share no base
            raise BackwardFailure(
                f"rank {self.rank} failed inside DeepSpeed's backward ({type(exc).__name__}: "
                f"{failures.first_line(exc)}); ZeRO-2 reduces gradients during backward, so the "
                "other ranks cannot re-run this step with it. The last checkpoint is in "
                "checkpoint_dir: resume with a smaller batch_size (or larger grad_accum)") from exc

    def settle(self, params, total, window, failed=None):
        """DDP's agreement on the loss and buffers (the engine holds the gradients); a local
        failure is told to the others at the vote they hold before each backward."""
        if failed is None:
            return super().settle([], total, window)
        if not isinstance(failed, _Agreed):
            self._vote(failed)
        return None

    def _vote(self, failed: BaseException | None) -> None:
        """One all-reduce of who failed: ``PeerOutOfMemory``/``PeerFailure`` on the ranks that
        did not when one did."""
        head = vote(failed).to(self._comm)
        dist.all_reduce(head)
        ooms, others, _, _ = head.tolist()
        self._peer_verdict(ooms, others, failed)

    def step(self) -> bool:
        """False when DeepSpeed skipped the update (non-finite gradients)."""
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        self._dirty = False
        return bool(self.engine.was_step_applied())

    def discard(self) -> None:
        """Drop the gradients this attempt already reduced: every rank backpropagates a NaN
        loss and steps, which DeepSpeed's overflow check turns into a skipped update that
        clears its gradient buffers (weights and optimizer state untouched)."""
        if not self._dirty:
            return
        params = [p for p in self._module.parameters() if p.requires_grad]
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.backward(sum(p.sum() for p in params) * math.nan, scale_wrt_gas=False)
        applied = self.step()
        if applied:  # would mean NaN reached the weights: never continue silently
            raise RuntimeError("DeepSpeed applied a step with NaN gradients; the weights are "
                               "no longer trustworthy (is zero_optimization.compute_grad_norm "
                               "off?)")

    def optimizer_state(self, optimizer) -> dict:
        """This rank's partition (the master weights follow from the model's on restore)."""
        return {"zero_rank": self.rank, "base": self.engine.optimizer.optimizer.state_dict()}

    def load_optimizer_state(self, optimizer, state: dict) -> None:
        if "ranks" in state:
            if len(state["ranks"]) != self.world_size:
                raise ValueError(
                    f"this checkpoint's optimizer state is split over {len(state['ranks'])} "
                    f"DeepSpeed ranks, this job has {self.world_size}: resume with "
                    f"{len(state['ranks'])} processes (ZeRO partitions follow the rank count), "
                    "or load only the weights (trainer.model.load_state_dict)")
            state = state["ranks"][self.rank]
        elif state.get("zero_rank") != self.rank:
            raise ValueError("optimizer state from another rank or strategy cannot be loaded "
                             "by a DeepSpeed rank")
        zero = self.engine.optimizer
        zero.optimizer.load_state_dict(state["base"])
        zero.refresh_fp32_params()  # master copies from the (just restored) weights

    def for_file(self, state: dict) -> dict:
        """Every rank's optimizer partition gathered into the state rank 0 writes."""
        parts = [None] * self.world_size
        dist.all_gather_object(parts, state["optimizer"])
        return {**state, "optimizer": {"world_size": self.world_size, "ranks": parts}}

    def file_ready(self, state: dict) -> bool:
        return "ranks" in state["optimizer"]
