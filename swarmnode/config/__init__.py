"""Node configuration: every default lives here, once, in one module per section.

Precedence is defaults < YAML file < CLI overrides (dotted keys, e.g. ``train.lr=1e-5``). The CLI only
passes overrides; it never repeats a default. Validators check a field; they never rewrite another
section. This package is in the base layer: it imports pydantic, yaml and ``swarmnode.errors``, never
torch or hivemind, so ``swarmnode --help`` and config errors answer in well under a second.

    node.py       NodeConfig (the sections, checks across them), load_config, parse_override
    model.py      model: the weights, their device and precision, LoRA, the tiny test model
    tasks.py      tasks: the reasoning-gym mix and the seeds of the question streams
    sampling.py   sampling: the backend, I questions x G completions, vLLM's settings
    train.py      train: AdamW, the clipped loss, micro-batch layout, mixed precision
    offpolicy.py  offpolicy and replay: data the current weights did not sample
    run.py        run: the run folder, checkpoints, the metrics endpoint, threads
    probe.py      probe: the fixed held-out yardstick of experiments
    swarm.py      swarm and bootstrap: joining, sharing, the bounds on peers, the bootstrap node
    strict.py     the base of every section: unknown keys are errors, values are frozen

Every public name is imported from here (``from swarmnode.config import NodeConfig``).
"""

from swarmnode.config.model import EMBEDDED_MODEL, LoraConfig, ModelConfig, TinyModelConfig
from swarmnode.config.node import NodeConfig, load_config, parse_override
from swarmnode.config.offpolicy import OffPolicyConfig, ReplayConfig
from swarmnode.config.probe import ProbeConfig
from swarmnode.config.run import RunConfig
from swarmnode.config.sampling import SamplingConfig
from swarmnode.config.swarm import RENAMED_SWARM_KEYS, BootstrapConfig, SwarmConfig
from swarmnode.config.tasks import DRAW_STRIDE, SAPO_TASKS, TasksConfig, TaskSpec
from swarmnode.config.train import TrainConfig

__all__ = [
    "DRAW_STRIDE",
    "EMBEDDED_MODEL",
    "RENAMED_SWARM_KEYS",
    "SAPO_TASKS",
    "BootstrapConfig",
    "LoraConfig",
    "ModelConfig",
    "NodeConfig",
    "OffPolicyConfig",
    "ProbeConfig",
    "ReplayConfig",
    "RunConfig",
    "SamplingConfig",
    "SwarmConfig",
    "TaskSpec",
    "TasksConfig",
    "TinyModelConfig",
    "TrainConfig",
    "load_config",
    "parse_override",
]
