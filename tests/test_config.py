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
                         "train.max_steps=5"], capture_output=True, text=True, cwd=REPO, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "lr: 0.02" in ok.stdout and "max_steps: 5" in ok.stdout and "# config hash:" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "vtg.config", "--params", str(params), "train.nope=1"],
                         capture_output=True, text=True, cwd=REPO, check=False)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "train.nope: unknown key" in bad.stderr


@pytest.mark.parametrize("name", ["strategy", "precision", "deterministic", "offload_optimizer", "offload_param"])
def test_an_engine_key_under_train_says_where_it_moved(params: Path, name: str):
    """The shared engine settings moved from `train` to `engine` (issue 36): an old key, from a file or the command
    line, is a one-line error naming the new key, not a bare "unknown key"."""
    write(params.parent / "experiments" / "old.yaml", f"train:\n  {name}: true\n")
    with pytest.raises(ConfigError) as e:
        load_config(params, "old")
    old = params.parent / "experiments" / "old.yaml"
    assert e.value.args[0].splitlines()[1:] == [f"  {old}: train.{name} moved to engine.{name}"]
    with pytest.raises(ConfigError, match=rf"<command line>: train.{name} moved to engine.{name}$"):
        load_config(params, None, [f"train.{name}=true"])


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["engine.offload_param=true"], r"engine.offload_param=true needs train.zero_stage 3 \(got train.zero_stage=2\)"),
        (["engine.offload_param=true", "train.zero_stage=3"],
         r"engine.offload_param=true needs rl.zero_stage 3 \(got rl.zero_stage=2; RL trains on the same engine"),
        (["engine.offload_optimizer=true", "train.zero_stage=0"],
         r"engine.offload_optimizer=true needs train.zero_stage >= 1"),
        (["engine.offload_optimizer=true", "rl.zero_stage=0"], r"engine.offload_optimizer=true needs rl.zero_stage >= 1"),
        (["train.model.attn_implementation=flash_attention_2"],
         r"flash_attention_2 needs engine.precision bf16 or fp16 \(got engine.precision=fp32"),
    ],
)
def test_the_engine_is_checked_against_each_stage_that_trains_on_it(params: Path, overrides: list, needle: str):
    with pytest.raises(ConfigError, match=needle):
        load_config(params, None, overrides)


def test_rl_off_frees_the_engine_from_rl_zero_stage(params: Path):
    cfg = load_config(params, None, ["engine.offload_param=true", "train.zero_stage=3", "orchestration.rl=false"])
    assert cfg.engine.offload_param and cfg.rl.zero_stage == 2
    assert load_config(params, None, ["engine.offload_param=true", "train.zero_stage=3", "rl.zero_stage=3"])
    assert load_config(params, None, ["train.model.attn_implementation=flash_attention_2", "engine.precision=bf16"])


def _leaf_values(section, prefix: str = "") -> dict:
    """Dotted key -> JSON value of every leaf field (nested sections walked; dict-valued fields are leaves)."""
    from pydantic import BaseModel

    out = {}
    data = section.model_dump(mode="json")
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            out.update(_leaf_values(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = data[name]
    return out


def _view_leaves(view: dict, prefix: str = "", section=None) -> set[str]:
    from pydantic import BaseModel

    keys = set()
    for name, value in view.items():
        nested = getattr(section, name)
        if isinstance(nested, BaseModel):
            keys |= _view_leaves(value, f"{prefix}{name}.", nested)
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_class_defaults_equal_params_yaml():
    """The classes hold the defaults; params.yaml is rendered from them, so every key must agree."""
    defaults, shipped = PipelineConfig(), load_config(REPO / "params.yaml")
    a, b = _leaf_values(defaults), _leaf_values(shipped)
    differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    assert not differing, "class default != params.yaml for: " + ", ".join(
        f"{k} ({a.get(k)!r} vs {b.get(k)!r})" for k in differing)
    assert defaults.model_dump() == shipped.model_dump()


def test_params_yaml_is_rendered_from_the_classes():
    """params.yaml is generated: defaults and comments are edited on the classes in vtg/config/*.py."""
    from vtg.config.render import render_params

    text, shipped = render_params(), (REPO / "params.yaml").read_text()
    first = next((i for i, (a, b) in enumerate(zip(text.splitlines(), shipped.splitlines())) if a != b),
                 min(len(text.splitlines()), len(shipped.splitlines())))
    assert text == shipped, (
        f"params.yaml differs from the config classes (first at line {first + 1}): change the default or docstring "
        "in vtg/config/*.py, then run `python -m vtg.config --write-params`")


def test_rendered_params_load_to_the_rendered_config(tmp_path: Path):
    """Rendering a non-default config round-trips too (values with quotes, flow lists and mappings)."""
    from vtg.config.render import render_params

    cfg = load_config(REPO / "params.yaml", None, [
        "tracking.tracking_uri=http://mlflow:5000", "train.checkpoint_hooks=[pkg.mod:fn]",
        "preprocess.split_fractions={train: 0.7, val: 0.2, test: 0.1}", "evaluate.select_metric=miou",
        "ingest.annotations=['a: b.jsonl', 'c # d.txt']", "train.lr=1e-5"])
    path = write(tmp_path / "params.yaml", render_params(cfg))
    assert load_config(path) == cfg


def test_write_params_cli(tmp_path: Path):
    out = tmp_path / "p.yaml"
    ok = subprocess.run([sys.executable, "-m", "vtg.config", "--write-params", str(out)],
                        capture_output=True, text=True, cwd=REPO, check=False)
    assert ok.returncode == 0, ok.stderr
    assert out.read_text() == (REPO / "params.yaml").read_text()
    bad = subprocess.run([sys.executable, "-m", "vtg.config", "--write-params", str(out), "train.lr=1"],
                         capture_output=True, text=True, cwd=REPO, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--write-params" in bad.stderr


def test_every_field_has_a_docstring():
    from pydantic import BaseModel

    missing = []

    def walk(section: BaseModel, prefix: str) -> None:
        for name, field in type(section).model_fields.items():
            if not (field.description or "").strip():
                missing.append(f"{prefix}{name}")
            value = getattr(section, name)
            if isinstance(value, BaseModel):
                walk(value, f"{prefix}{name}.")

    walk(PipelineConfig(), "")
    assert not missing, f"fields without a docstring (they become params.yaml's comments): {missing}"


NOT_OUTPUT_FIELDS = {
    "corpus": {"out_dir", "workers"},
    "ingest": {"out", "dead_letter", "summary"},
    "annotate": {"records", "out", "proposals", "withheld", "summary", "progress", "device"},
    "preprocess": {"records", "out_dir", "runner", "runner_profiles", "direct_num_workers", "progress",
                   "decode_threads"},
    "train": {"out_dir", "resume", "checkpoint_hooks", "progress", "log_every", "data.prefetch_factor", "gpu_mem_gb",
              "peak_tflops"},
    "evaluate": {"out_dir", "store_dir", "select_dir", "device", "reuse", "batch_size", "split", "registry_alias",
                 "overfit_patience"},
    "engine": set(),
    "tracking": set(),
    "orchestration": {"network_timeout_s", "state_dir", "report_path"},
}
RUN_LENGTH_FIELDS = {"train": {"max_steps", "save_every", "keep_last", "early_stop", "early_stop_patience"}}


@pytest.mark.parametrize("name", sorted(NOT_OUTPUT_FIELDS))
def test_output_and_trajectory_views_drop_exactly_the_marked_fields(name: str):
    from vtg.config.keys import output_view, trajectory_view

    section = getattr(PipelineConfig(), name)
    every = set(_leaf_values(section))
    output, trajectory = _view_leaves(output_view(section), "", section), \
        _view_leaves(trajectory_view(section), "", section)
    assert every - output == NOT_OUTPUT_FIELDS[name]
    assert every - trajectory == NOT_OUTPUT_FIELDS[name] | RUN_LENGTH_FIELDS.get(name, set())
    if name == "train":
        assert "max_steps" in output and "progress" not in output
        assert "max_steps" not in trajectory and "lr" in trajectory and "data.split" in trajectory
        assert "prefetch_factor" not in output_view(section)["data"]


def test_rendered_params_do_not_show_the_markers():
    from vtg.config.render import render_params

    text = render_params()
    assert "vtg_output" not in text and "run_length" not in text and "json_schema_extra" not in text
