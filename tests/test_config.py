import subprocess
import sys
from pathlib import Path

import pytest

from vtg.config import ConfigError, PipelineConfig, config_hash, load_config, parse_overrides

REPO = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def params(tmp_path: Path) -> Path:
    write(tmp_path / "experiments" / "base.yaml", "train:\n  lr: 0.01\n  max_steps: 10\n")
    write(tmp_path / "experiments" / "exp_001.yaml", "extends: base\ntrain:\n  lr: 0.02\n")
    write(tmp_path / "experiments" / "exp_002.yaml",
          "extends: exp_001\ntrain:\n  model:\n    finetune: lora\n")
    return write(tmp_path / "params.yaml", "train:\n  lr: 0.001\n  seed: 7\ncorpus:\n  seed: 3\n")


def test_shipped_params_and_every_experiment_validate():
    cfg = load_config(REPO / "params.yaml")
    assert cfg == load_config(REPO / "params.yaml")
    names = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))
    assert "tiny" in names and len(names) >= 3
    for name in names:
        assert isinstance(load_config(REPO / "params.yaml", name), PipelineConfig)


def test_shipped_params_yaml_sets_every_key():
    """params.yaml is the documented source of truth: it spells out every section."""
    import yaml

    data = yaml.safe_load((REPO / "params.yaml").read_text())
    assert set(data) == set(PipelineConfig.model_fields)


def test_experiment_chain_and_cli_override_order(params: Path):
    cfg = load_config(params, "exp_002", ["train.max_steps=99"])
    assert cfg.train.lr == 0.02  # exp_001 beats base beats params.yaml
    assert cfg.train.model.finetune == "lora"  # exp_002
    assert cfg.train.max_steps == 99  # command line wins last
    assert cfg.train.seed == 7  # untouched keys come from params.yaml
    assert cfg.corpus.seed == 3


def test_overrides_parse_yaml_scalars():
    assert parse_overrides(["train.lr=5e-5", "train.model.freeze_vision=true", "a.b=x"]) == {
        "train": {"lr": 5e-5, "model": {"freeze_vision": True}}, "a": {"b": "x"}}
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["train.lr"])


@pytest.mark.parametrize(
    "where, text, needle",
    [
        ("params", "train:\n  lrr: 0.1\n", r"params.yaml: train.lrr: unknown key"),
        ("params", "train:\n  lr: fast\n", r"params.yaml: train.lr: .*number"),
        ("params", "train:\n  zero_stage: 5\n", r"params.yaml: train.zero_stage: .*less than or equal to 3"),
        ("exp", "extends: base\ntrian:\n  lr: 1\n", r"exp_bad.yaml: trian: unknown key"),
        ("exp", "train:\n  model:\n    finetune: qlora9\n", r"exp_bad.yaml: train.model.finetune"),
    ],
)
def test_errors_name_the_key_and_file(params: Path, where: str, text: str, needle: str):
    if where == "params":
        write(params, text)
        exp = None
    else:
        write(params.parent / "experiments" / "exp_bad.yaml", text)
        exp = "exp_bad"
    with pytest.raises(ConfigError, match=needle):
        load_config(params, exp)


def test_cli_override_errors_name_the_command_line(params: Path):
    with pytest.raises(ConfigError, match=r"<command line>: train.lr: .*greater than 0"):
        load_config(params, None, ["train.lr=-1"])


def test_missing_experiment_lists_known_ones(params: Path):
    with pytest.raises(ConfigError, match=r"not found \(known: base, exp_001, exp_002\)"):
        load_config(params, "exp_404")


def test_extends_cycle_is_an_error(params: Path):
    write(params.parent / "experiments" / "a.yaml", "extends: b\n")
    write(params.parent / "experiments" / "b.yaml", "extends: a\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(params, "a")


def test_bad_yaml_names_the_line(params: Path):
    write(params, "train:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"params.yaml:\d+: not valid YAML"):
        load_config(params)


def test_config_hash_is_stable_and_sensitive(params: Path):
    a, b = load_config(params), load_config(params)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(load_config(params, None, ["train.lr=0.5"]))
    assert config_hash(a.corpus) == config_hash(load_config(params, None, ["train.lr=0.5"]).corpus)


def test_dry_run_prints_resolved_config_and_bad_key_is_one_line(params: Path):
    ok = subprocess.run([sys.executable, "-m", "vtg.config", "--params", str(params), "-e", "exp_001",
                         "train.max_steps=5"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert "lr: 0.02" in ok.stdout and "max_steps: 5" in ok.stdout and "# config hash:" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "vtg.config", "--params", str(params), "train.nope=1"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "train.nope: unknown key" in bad.stderr
