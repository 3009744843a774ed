"""Measuring: the memory sampler (one thread), timing, and wall-clock throughput with FLOP
accounting. Everything above it (the Trainer, the live view, ``hn.compare``) measures with these."""
