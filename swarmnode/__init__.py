"""swarmnode: a node for decentralized RL post-training of language models (SAPO-style sharing)."""

__version__ = "0.1.0"
