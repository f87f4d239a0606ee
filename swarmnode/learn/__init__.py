"""The learner: GRPO/DAPO loss, off-policy correction, replay, batching and the training step.

Depends on torch and the base modules only (config, rollouts, prompts); never on tasks, policy or
the network (``swarmnode.swarm``), so it can be read and tested as plain math on tensors.
"""
