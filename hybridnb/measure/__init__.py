"""Measuring: ``compare()`` (variants side by side), timing and the memory sampler."""
