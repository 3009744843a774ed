"""What a checkpoint holds, and a run going back to one.

A full state is the learner's states (weights, optimizer, schedule, EMA, guard), the scaler, the
run state's ``SAVED`` fields (state.py), every RNG (the train loader's generator included) and the
config it ran with: plain CPU data that loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from hybridnb.train import recovery
from hybridnb.train.bus import Ended
from hybridnb.train.seeding import rng_state, set_rng_state


def state_dict(loop) -> dict:
    """Everything needed to continue ``loop``'s run exactly."""
    run, learner, placement, settings = loop.state, loop.learner, loop.placement, loop.settings
    generator = loop.loaders.generator  # the train loader's, or None
    rng = run.pending_rng if run.pending_rng is not None else {
        **rng_state(), "loader": generator.get_state() if generator is not None else None}
    return {"kind": "last", **learner.state_dict(placement.strategy),
            "rng": recovery.to_cpu(rng), **recovery.to_cpu(run.state_dict()),
            "scaler": placement.precision.scaler.state_dict(),
            "config": {"lr": settings.lr, "epochs": settings.epochs,
                       "batch_size": settings.batch_size, "grad_accum": settings.grad_accum,
                       "seed": settings.seed, "model": type(learner.model).__name__},
            "device": str(placement.device), "precision": placement.precision.name}


def restore(loop, state: dict, events: bool = False) -> None:
    """``state`` loaded into every part of the run (its events only with ``events``)."""
    run, learner, placement = loop.state, loop.learner, loop.placement
    learner.load_state_dict(state, placement.strategy)
    if placement.precision.scaler.is_enabled() and state["scaler"]:
        placement.precision.scaler.load_state_dict(state["scaler"])
    run.load_state_dict(state, events=events)


def rewind(loop, state: dict) -> None:
    """Back to a ``state_dict`` taken earlier in this process, its RNG states now; the events
    said since are kept."""
    restore(loop, state)
    set_rng_state(loop.state.pending_rng)
    loop.state.pending_rng = None


def load(loop, state: dict) -> None:
    """Continue ``loop``'s run from ``state`` (its events too); a checkpoint of another batch
    size continues its epoch after about as many samples (said)."""
    restore(loop, state, events=True)
    run, s = loop.state, loop.settings
    old = (state.get("config", {}).get("batch_size"), state.get("config", {}).get("grad_accum"))
    if None not in old and old != (s.batch_size, s.grad_accum) and run.batches_done:
        samples = run.batches_done * old[0]
        run.batches_done = samples // s.batch_size // s.grad_accum * s.grad_accum
        loop.bus.note("resume", f"the checkpoint used batch_size={old[0]} x grad_accum="
                      f"{old[1]}, this run {s.batch_size} x {s.grad_accum}: the epoch "
                      f"continues after about {samples} samples, not bit for bit")


def save_last(loop) -> None:
    """The last good state kept, and written when this fit has a ``checkpoint_dir``."""
    if loop.settings.checkpoint_dir is None:
        return loop.checkpoints.keep(state_dict(loop))
    loop.heartbeat.beat("checkpoint")
    loop.checkpoints.keep(loop.placement.strategy.for_file(state_dict(loop)), write=True)
    loop.heartbeat.beat("step")


def finish(loop, failed: bool) -> None:
    """A fit's end: the model takes the weights fit chose (a failed fit's crash state is
    written instead) and the view ends with the summary."""
    placement, settings = loop.placement, loop.settings
    placement.end_fit()
    if failed and settings.checkpoint_dir is not None:
        loop.checkpoints.save_crash(placement.strategy.file_ready)
    said = None if failed else loop.learner.take_final_weights(loop.state.best, settings)
    if said:
        loop.bus.say(*said)
    summary = loop.progress.summary(loop.state, settings.monitor, placement.device,
                                    placement.precision.name)
    loop.bus.emit(Ended({**summary, "failed": failed}))


# Going back to the last good state (``checkpoints.snapshot``) during one fit.


def continue_on_cpu(loop, detail: str) -> None:
    """Sticky device error: the whole run continues on the CPU from the last good state
    (a CPU-side snapshot; nothing reads the lost device again)."""
    lost, snapshot = loop.placement.device, loop.checkpoints.snapshot
    loop.bus.say("device_lost", f"{detail} — {lost} cannot be trusted again in this "
                 "process. Moving the run (model, optimizer state, scaler, EMA) to the CPU "
                 f"and continuing from the last good state (step "
                 f"{snapshot['position']['global_step']}) in fp32; steps will be slower")
    loop.placement.continue_on_cpu(loop.loaders)
    loop.learner.rebuild_on_cpu()
    restore(loop, snapshot)
    loop.state.micro = None  # the GPU's micro-batch size means nothing here
    loop.placement.build_step(loop)


def after_bad_steps(loop) -> None:
    """``patience`` bad steps in a row: back to the last good state, the lower LR kept."""
    state, snapshot = loop.state, loop.checkpoints.snapshot
    at = snapshot["position"]["global_step"]
    loop.restores[at] = loop.restores.get(at, 0) + 1
    if loop.restores[at] > 3:
        raise FloatingPointError(
            f"the loss stays non-finite or spiking after 3 restores to step {at} (epoch "
            f"{snapshot['position']['epoch']}), with the learning rate cut to "
            f"{state.lr_scale:.3g} of the schedule. Likely causes: non-finite values in a "
            "custom loss or model output, or a learning rate far too high; check "
            "trainer.steps and trainer.events")
    lr_scale = state.lr_scale
    loop.bus.say("restore", f"{loop.learner.guard.patience} bad steps in a row: restoring "
                 f"the last good state (step {at}) and keeping the lower learning rate "
                 f"({lr_scale:.3g} of the schedule)")
    restore(loop, snapshot)
    state.lr_scale = lr_scale
    loop.learner.guard.streak = 0


def after_interrupt(loop) -> None:
    """A KeyboardInterrupt inside a step or a validation: the step is dropped; one that came
    during the optimizer update goes back to the last good weights."""
    loop.learner.optimizer.zero_grad(set_to_none=True)
    if loop.placement.recovery.phase == "update":  # the update may be half done
        restore(loop, loop.checkpoints.snapshot)
        loop.bus.say("restore", "interrupted during the optimizer update: restored the last "
                     f"good state (step {loop.state.global_step})")
