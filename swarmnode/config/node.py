"""The whole config, ``NodeConfig``, and how it is built: defaults < a run folder's saved config < a YAML
file < dotted ``--set`` overrides, with one error naming the source and the field of every problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from swarmnode.config.model import ModelConfig
from swarmnode.config.offpolicy import OffPolicyConfig, ReplayConfig
from swarmnode.config.probe import ProbeConfig
from swarmnode.config.run import RunConfig
from swarmnode.config.sampling import SamplingConfig
from swarmnode.config.strict import Strict
from swarmnode.config.swarm import BootstrapConfig, SwarmConfig
from swarmnode.config.tasks import TasksConfig
from swarmnode.config.train import TrainConfig
from swarmnode.errors import ConfigError


class NodeConfig(Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    offpolicy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig)

    @model_validator(mode="after")
    def _check(self) -> NodeConfig:
        if self.train.clip_low >= 1:
            raise ValueError("train.clip_low must be < 1 (the ratio's lower bound is 1 - clip_low)")
        if self.train.kl_convex and self.train.kl_beta <= 0:
            raise ValueError("train.kl_convex splits the KL penalty: set train.kl_beta > 0 as well")
        return self


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'train.lr=1e-5'`` -> ``('train.lr', 1e-5)``; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.lr=1e-5")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({_yaml_problem(exc)})") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message on one line: the problem and where it is."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(exc, 'problem', None) or exc}{where}"


def _describe(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown field '{field}'")
        else:
            lines.append(f"{source}: field '{field}': {item['msg']}")
    return "\n".join(lines)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, section by section (a section given in ``top`` keeps ``base``'s other keys)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {_yaml_problem(exc)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return loaded


def load_config(
    path: Path | str | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    base: Path | None = None,
) -> NodeConfig:
    """Build a NodeConfig: defaults < ``base`` (a run folder's saved config) < YAML file ``path`` <
    dotted ``overrides``.

    Raises ConfigError with a message naming the file and the field on any problem.
    """
    tree: dict[str, Any] = {}
    sources = [] if base or path else ["defaults"]
    for layer in (base, path):
        if layer is not None:
            tree = _merge(tree, _read_yaml(Path(layer)))
            sources.append(str(layer))
    for dotted, value in (overrides or {}).items():
        _set_dotted(tree, dotted, value)
    if overrides:
        sources.append("command-line overrides")
    try:
        return NodeConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, " + ".join(sources))) from None
