"""Samplers: G completions per prompt with the behaviour log-probs of the sampled tokens."""

from swarmnode.sampler.base import Sampler, make_sampler

__all__ = ["Sampler", "make_sampler"]
