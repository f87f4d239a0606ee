"""``swarmnode export``: a checkpoint as a plain Hugging Face folder (config.json, tokenizer, safetensors)
that ``AutoModelForCausalLM.from_pretrained`` loads with no swarmnode installed.

The model is rebuilt from the run folder's saved config (so the right architecture and tokenizer come
back), the checkpoint's weights are loaded into it, and a LoRA run's adapters are merged into the base
weights, so the folder needs neither swarmnode nor peft.
"""

from __future__ import annotations

from pathlib import Path

from swarmnode.checkpoint import choose, load_model_weights
from swarmnode.common import log
from swarmnode.config import NodeConfig
from swarmnode.errors import ConfigError
from swarmnode.policy import load_policy


def export_checkpoint(
    cfg: NodeConfig, out: Path, *, round_: int | None = None, adapter: bool = False
) -> Path:
    """Write the chosen checkpoint of ``cfg.run.run_dir`` to ``out`` (which must not hold files yet)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} is not empty: choose a new folder")
    if adapter and cfg.model.lora is None:
        raise ConfigError(
            "--adapter: this run trains full weights (model.lora is not set); export without it"
        )
    info = choose(cfg.run.run_dir, round_=round_)
    if info is None:
        raise ConfigError(f"{cfg.run.run_dir} holds no valid checkpoint yet: nothing to export")
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    load_model_weights(info, policy.model)
    model = policy.model
    if cfg.model.lora is not None:
        model = model.merge_and_unload()  # peft: plain weights, loadable without peft
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    policy.tokenizer.save_pretrained(out)
    log(f"exported {info.path} (round {info.round}, policy v{info.policy_version}) to {out}")
    return out
