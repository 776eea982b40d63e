"""Samplers (data) and the on-device sampling function; the constraint interface grows here."""

from llamay.sample.samplers import GREEDY, Sampler, SamplingParams, sample, seed_keys

__all__ = ["GREEDY", "Sampler", "SamplingParams", "sample", "seed_keys"]
