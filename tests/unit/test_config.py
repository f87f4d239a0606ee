"""Config: every shipped YAML loads, precedence, errors that name field and file, light imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel

from swarmnode.config import DRAW_STRIDE, NodeConfig, load_config, parse_override
from swarmnode.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
YAMLS = sorted((REPO / "node_configs").glob("*.yaml"))
HEAVY = ("torch", "transformers", "hivemind", "reasoning_gym")


def test_node_configs_exist() -> None:
    assert {p.name for p in YAMLS} >= {"tiny.yaml", "solo.yaml"}


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_every_shipped_yaml_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, NodeConfig) and cfg.tasks.mix


def test_defaults_then_yaml_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("train: {lr: 1.0e-4, seed: 3}\nsampling: {max_new_tokens: 32}\n")
    cfg = load_config(path, {"train.lr": 2e-5, "run.rounds": 7})
    defaults = NodeConfig()
    assert cfg.train.lr == 2e-5  # override beats YAML
    assert cfg.train.seed == 3 and cfg.sampling.max_new_tokens == 32  # YAML beats default
    assert cfg.run.rounds == 7  # override of a field the YAML does not mention
    assert cfg.sampling.temperature == defaults.sampling.temperature  # untouched default
    assert cfg.train.betas == defaults.train.betas and cfg.model.name == defaults.model.name
    assert load_config(None) == defaults and load_config(path).train.lr == 1e-4


def test_an_override_from_the_command_line_is_parsed_as_yaml() -> None:
    assert parse_override("train.lr=1.0e-5") == ("train.lr", 1e-5)
    assert parse_override(" run.resume =false") == ("run.resume", False)
    assert parse_override("tasks.mix.bf={weight: 2}") == ("tasks.mix.bf", {"weight": 2})
    assert parse_override("swarm.swarm_id=a=b") == ("swarm.swarm_id", "a=b")  # split at the first '='
    assert load_config(None, dict([parse_override("train.lr=1e-5")])).train.lr == 1e-5  # '1e-5': a str


def test_autocast_off_is_off_from_a_file_and_from_the_command_line(tmp_path: Path) -> None:
    # YAML 1.1 (PyYAML) reads a bare `off` as false; the documented value must still work both ways
    path = tmp_path / "node.yaml"
    path.write_text("train: {autocast: off}\n")
    assert load_config(path).train.autocast == "off"
    assert load_config(None, dict([parse_override("train.autocast=off")])).train.autocast == "off"
    with pytest.raises(ConfigError, match="train.autocast"):
        load_config(None, {"train.autocast": True})  # `on` is not a value of this field


def test_unknown_key_names_the_field_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("train:\n  lrr: 1.0e-4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: unknown field 'train.lrr'"
    with pytest.raises(
        ConfigError, match=r"tiny\.yaml \+ command-line overrides: unknown field 'sampling\.tmp'"
    ):
        load_config(REPO / "node_configs" / "tiny.yaml", {"sampling.tmp": 1})


def test_bad_value_names_the_field_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train: {lr: -1}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: field 'train\.lr': Input should be greater than 0$"):
        load_config(path)
    with pytest.raises(
        ConfigError, match=r"^defaults \+ command-line overrides: .*train\.clip_low must be < 1"
    ):
        load_config(None, {"train.clip_low": 1.5})
    with pytest.raises(ConfigError, match=r"swarm\.min_peers=16 must be < swarm\.view_size=16"):
        load_config(None, {"swarm.view_size": 16, "swarm.min_peers": 16})


def test_min_peers_beyond_the_view_says_which_fields_to_change() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"swarm.view_size": 16, "swarm.min_peers": 20})
    message = str(err.value)
    assert message.startswith("defaults + command-line overrides: field 'swarm': ")
    assert "swarm.min_peers=20 must be < swarm.view_size=16" in message
    assert message.endswith("lower swarm.min_peers or raise swarm.view_size")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train.lr", "expected KEY=VALUE"),
        ("=1", "expected KEY=VALUE"),
        ("train.lr=[1,", "value is not valid YAML"),
    ],
)
def test_set_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_override(text)
    assert repr(text) in str(err.value)


def test_a_set_value_error_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_override("train.lr=[1,")
    assert "\n" not in str(err.value)


def test_override_below_a_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"override 'train\.lr\.x': 'lr' is not a section"):
        load_config(REPO / "node_configs" / "tiny.yaml", {"train.lr.x": 1})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train: [1,\n", "malformed YAML: .* at line 2"),
        ("- a\n- b\n", "expected a mapping"),
        (None, "not found"),
    ],
)
def test_unreadable_files(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "node.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_config_and_cli_imports_stay_light() -> None:
    proc = _python(
        f"import json, sys; import swarmnode.config, swarmnode.cli; print(json.dumps([m for m in {HEAVY!r} "
        "if m in sys.modules]))"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_a_config_error_answers_without_importing_the_heavy_stack(tmp_path: Path) -> None:
    """The CLI's error path must not import torch & co. just to classify the exception (seconds)."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from swarmnode.cli import app
        try:
            app(["solo", "--set", "train.lrr=1", "--run-dir", {str(tmp_path)!r}], prog_name="swarmnode")
        except SystemExit as exc:
            print(json.dumps([exc.code, [m for m in {HEAVY!r} if m in sys.modules]]))
        """
    )
    proc = _python(code)
    assert json.loads(proc.stdout) == [2, []], proc.stderr
    assert proc.stderr == "error: defaults + command-line overrides: unknown field 'train.lrr'\n"


def test_help_lists_the_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("solo", "eval", "keygen"):
        assert command in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "solo", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--set" in proc.stdout and "--run-dir" in proc.stdout


def test_the_old_name_of_peer_groups_per_round_still_works_with_a_deprecation_line():
    with pytest.warns(
        FutureWarning, match="swarm.external_per_round is deprecated.*swarm.peer_groups_per_round"
    ):
        cfg = load_config(None, {"swarm.external_per_round": 2})
    assert cfg.swarm.peer_groups_per_round == 2


def test_old_and_new_name_together_is_an_error_naming_both():
    with pytest.raises(ConfigError, match="external_per_round.*peer_groups_per_round"):
        load_config(None, {"swarm.external_per_round": 2, "swarm.peer_groups_per_round": 3})


@pytest.mark.parametrize("addr", ["1.2.3.4:31337", "/ip4/127.0.0.1/tcp/1234", "/ip4/1.2.3.4/tcp/1/p2p/ 12D3"])
def test_an_initial_peer_without_a_peer_id_is_refused_before_anything_starts(addr: str):
    with pytest.raises(ConfigError, match="swarm.initial_peers.*not a full multiaddr.*/p2p/"):
        load_config(None, {"swarm.initial_peers": [addr]})


def test_a_weight_may_be_zero_but_not_every_weight() -> None:
    """Weight 0 keeps a dataset in the mix (verified and trained on from peers) without sampling it."""
    cfg = load_config(None, {"tasks.mix": {"bf": {"weight": 0}, "basic_arithmetic": {}}})
    assert cfg.tasks.mix["bf"].weight == 0 and cfg.tasks.mix["basic_arithmetic"].weight == 1
    with pytest.raises(ConfigError, match=r"field 'tasks\.mix': .*every weight is 0.*> 0"):
        load_config(None, {"tasks.mix": {"bf": {"weight": 0}, "basic_arithmetic": {"weight": 0.0}}})
    with pytest.raises(ConfigError, match=r"field 'tasks\.mix\.bf\.weight': .*greater than or equal to 0"):
        load_config(None, {"tasks.mix": {"bf": {"weight": -1}}})


def test_questions_per_round_fits_a_round_of_the_question_stream() -> None:
    assert load_config(None, {"sampling.questions_per_round": DRAW_STRIDE}).sampling.questions_per_round
    with pytest.raises(ConfigError, match=r"field 'sampling\.questions_per_round': .*less than or equal"):
        load_config(None, {"sampling.questions_per_round": DRAW_STRIDE + 1})


def test_the_probe_is_off_by_default_and_checked() -> None:
    probe = NodeConfig().probe
    assert (probe.every_rounds, probe.questions_per_task) == (0, 32)
    assert load_config(None, {"probe.every_rounds": 5}).probe.every_rounds == 5
    with pytest.raises(ConfigError, match=r"field 'probe\.questions_per_task'"):
        load_config(None, {"probe.questions_per_task": 0})
    with pytest.raises(ConfigError, match=r"unknown field 'probe\.every'"):
        load_config(None, {"probe.every": 5})


def _descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Every field description and section docstring under ``model``, by dotted name."""
    found = {model.__name__: model.__doc__ or ""}
    for name, field in model.model_fields.items():
        found[name] = field.description or ""
        for arg in (field.annotation, *get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found.update({f"{name}.{key}": text for key, text in _descriptions(arg).items()})
    return found


def test_descriptions_say_what_they_refer_to_not_an_issue_number() -> None:
    texts = _descriptions(NodeConfig)
    assert "offpolicy.peer_defence" in texts and "model.tiny.seed" in texts  # the walk reaches nested ones
    assert {key: text for key, text in texts.items() if re.search(r"#\d", text)} == {}
