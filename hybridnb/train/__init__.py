"""Training: the public Trainer and its loop (trainer.py), the one training step, recovery,
the run's state, checkpoints, data loading, precision, schedules, losses and metrics."""
