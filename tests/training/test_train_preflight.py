"""The weight-free pre-flight: every shipped experiment fits; recipes that cannot fit fail with a fix that works."""

import json
import time

import numpy as np
import pytest
from support.train_fixtures import REPO_ROOT, synthetic_window, train_config

from training.activations import activation_bytes
from training.arch import Arch, arch_for
from training.preflight import (
    PreflightError,
    check_before_training,
    longest_answer,
    main,
    preflight,
)
from vtg.cli_common import run_cli
from vtg.config import load_config

PARAMS = REPO_ROOT / "params.yaml"
EXPERIMENTS = sorted(p.stem for p in (REPO_ROOT / "experiments").glob("*.yaml"))


QUERY = ("the person in the red shirt walks slowly across the kitchen to the wooden table, picks up a small blue "
         "cup with the left hand, drinks from it, puts it back down next to the open laptop, and then leaves the "
         "room through the door on the right ") * 4


def query_of(tokenizer, n: int) -> str:
    """The longest prefix of QUERY that is exactly `n` tokens as the prompt holds it."""
    from vtg.model.text import query_ids

    for k in range(len(QUERY), 0, -1):
        if len(query_ids(tokenizer, QUERY[:k])) == n:
            return QUERY[:k]
    raise AssertionError(f"no prefix of {n} tokens")


def _cfg(experiment=None, *overrides):
    return load_config(PARAMS, experiment, list(overrides))


def test_there_are_experiments_to_check():
    assert {"tiny", "qwen25vl_3b_lora_1gpu", "qwen25vl_7b_zero2_8gpu"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_shipped_experiment_passes(experiment, tmp_path, capsys):
    out = tmp_path / "preflight.json"
    assert main(["--params", str(PARAMS), "-e", experiment, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "verdict   OK" in printed
    numbers = json.loads(out.read_text())
    assert numbers["ok"] and numbers["verdict"] == "OK" and not numbers["fix"]
    tokens, memory = numbers["tokens"], numbers["memory"]
    assert tokens["total"] == tokens["video_tokens"] + tokens["text_tokens"] <= tokens["max_seq_len"]
    assert memory["configured"]["total_b"] <= numbers["gpu_mem_gb"] * 2**30
    assert memory["with_checkpointing"]["activations_b"] < memory["without_checkpointing"]["activations_b"]


def test_recipe_video_tokens_come_from_the_real_geometry():
    """32 frames at 336 px through patch 14, 2x2 merge, temporal patch 2 = 2,304 video tokens (docs/environment.md)."""
    for experiment in ("qwen25vl_3b_lora_1gpu", "qwen25vl_7b_zero2_8gpu"):
        report = preflight(_cfg(experiment))
        assert report.tokens.video_tokens == (336 // 14) ** 2 // 4 * 32 // 2 == 2304
        assert report.tokens.grid == (16, 24, 24)
        assert report.tokens.total > 2048  # the old max_seq_len default could not hold it
        assert "vtg/model/archs" in report.arch_source and "real tokenizer" in report.tokenizer_note


def test_short_max_seq_len_fails_naming_the_key_and_a_value_that_fits(capsys):
    argv = ["--params", str(PARAMS), "-e", "qwen25vl_3b_lora_1gpu", "train.data.max_seq_len=1024"]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err
    report = preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.data.max_seq_len=1024"))
    assert not report.ok and report.fix == ["train.data.max_seq_len=2560"]
    assert "train.data.max_seq_len=1024" in err and "set train.data.max_seq_len=2560" in err
    assert "preprocess.num_frames=" in err  # the other way out: fewer frames
    assert preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.data.max_seq_len=1024", *report.fix)).ok
    # The fewer-frames alternative fits too.
    frames = err.split("preprocess.num_frames=")[1].split(")")[0]
    assert preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.data.max_seq_len=1024",
                          f"preprocess.num_frames={frames}")).ok


def test_absurd_memory_fails_with_a_fix_that_fits():
    bad = ("train.num_gpus=1", "train.gpu_mem_gb=24", "train.zero_stage=0")
    report = preflight(_cfg("qwen25vl_7b_zero2_8gpu", *bad))  # 7B full fine-tuning on one 24 GB GPU, ZeRO-0
    assert not report.ok and report.tokens.total <= report.max_seq_len
    assert "train.gpu_mem_gb=24" in report.message() and report.fix
    assert all(f in report.message() for f in report.fix)
    assert any(f.startswith("engine.offload_optimizer=") for f in report.fix)  # 8.3B params cannot sit on one GPU
    fixed = preflight(_cfg("qwen25vl_7b_zero2_8gpu", *bad, *report.fix))
    assert fixed.ok, fixed.message()


def test_checkpointing_is_the_first_fix_when_it_suffices():
    report = preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.model.gradient_checkpointing=false"))
    assert report.fix == ["train.model.gradient_checkpointing=true"]
    assert "train.model.gradient_checkpointing=true" in report.message()
    # Already checkpointing and still too big: the next lever is a smaller micro-batch at the same global batch.
    small = preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.gpu_mem_gb=16"))
    # The recipe packs under a token budget (2 x the longest example): the budget shrinks with the micro-batch.
    assert small.fix == ["train.micro_batch_size=1", "train.grad_accum=16", "train.data.token_budget=2487"], \
        small.message()
    assert preflight(_cfg("qwen25vl_3b_lora_1gpu", "train.gpu_mem_gb=16", *small.fix)).ok


def test_a_recipe_nothing_can_fit_says_so():
    report = preflight(_cfg("qwen25vl_7b_zero2_8gpu", "train.num_gpus=1", "train.gpu_mem_gb=2"))
    assert not report.ok and not report.fix and "add GPUs" in report.message()


def test_activation_estimate_grows_with_sequence_and_checkpointing_lowers_it():
    arch = arch_for("Qwen/Qwen2.5-VL-7B-Instruct")[0]
    totals = []
    for seq in (512, 1024, 2048, 4096):
        full = activation_bytes(arch, seq, 1, vision_patches=4 * seq, vision_span=576)
        ckpt = activation_bytes(arch, seq, 1, vision_patches=4 * seq, vision_span=576, checkpointing=True)
        assert ckpt.total_b < full.total_b and ckpt.text_b < full.text_b and ckpt.recompute_b > 0
        assert activation_bytes(arch, seq, 2).total_b == pytest.approx(2 * activation_bytes(arch, seq, 1).total_b)
        assert activation_bytes(arch, seq, 1, eager=True).total_b > activation_bytes(arch, seq, 1).total_b
        totals.append(full.total_b)
    assert totals == sorted(totals) and totals[-1] > 7 * totals[0]
    fp32 = activation_bytes(arch, 1024, 1, precision="fp32")
    assert fp32.text_b == pytest.approx(2 * activation_bytes(arch, 1024, 1).text_b)


def test_text_layer_formula_is_the_documented_korthikanti_form():
    """Per layer s*b*h*(22 + 8*i/h + 6*a*s/h) (eager): Korthikanti's s*b*h*(34 + 5*a*s/h) recounted for Qwen; an
    MLP of width 1.5h gives its 34 exactly. Checkpointing keeps 2*s*b*h per layer (measured: test_train_plan)."""
    h, a, s, b, layers = 1024, 16, 2000, 3, 4
    arch = Arch({"hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": a,
                 "intermediate_size": 3 * h // 2, "vocab_size": 0, "num_key_value_heads": a},
                {"hidden_size": 64, "depth": 1, "num_heads": 1, "intermediate_size": 64, "patch_size": 14,
                 "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": h})
    assert activation_bytes(arch, s, b).text_b == pytest.approx(layers * s * b * h * 34)
    assert activation_bytes(arch, s, b, eager=True).text_b == pytest.approx(layers * s * b * h * (34 + 6 * a * s / h))
    assert activation_bytes(arch, s, b, checkpointing=True).text_b == layers * 2 * s * b * h


@pytest.mark.parametrize("timestamps", ["native", "text"])
@pytest.mark.parametrize("position", ["before", "after"])
def test_tiny_count_matches_encode_example_on_a_real_example(timestamps, position, tiny_model_dir):
    from transformers import AutoConfig, AutoTokenizer

    from vtg.model.processing import (
        QUERY_POSITION_KEY,
        TIMESTAMPS_KEY,
        VisionParams,
        answer_text,
        encode_example,
    )
    from vtg.shards import decode_jpegs

    cfg = _cfg(None, f"train.data.timestamps={timestamps}", f"train.data.query_position={position}")
    report = preflight(cfg)
    p = cfg.preprocess
    meta, jpegs = synthetic_window(np.random.default_rng(0), "vid-0000", "train", num_frames=p.num_frames,
                                   size=p.frame_size, duration=p.max_window_s)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)  # as training's build_model sets it up
    tokenizer.init_kwargs[TIMESTAMPS_KEY] = timestamps
    tokenizer.init_kwargs[QUERY_POSITION_KEY] = position
    vision = VisionParams.from_model_config(AutoConfig.from_pretrained(tiny_model_dir))
    frames = decode_jpegs(jpegs)
    query = query_of(tokenizer, cfg.ingest.max_query_tokens)  # the longest query ingest lets in
    longest = encode_example(tokenizer, frames, meta.frame_timestamps, query, longest_answer(p.max_window_s),
                             vision=vision)
    assert len(longest["input_ids"]) == report.tokens.total
    assert int((longest["mm_token_type_ids"] == 2).sum()) == report.tokens.video_tokens
    q = meta.queries[0]  # the window's own (short) query is within the pre-flight's bound
    real = encode_example(tokenizer, frames, meta.frame_timestamps, q.text, answer_text(q.windows), vision=vision)
    assert len(real["input_ids"]) < report.tokens.total


def test_training_stops_before_building_the_model(shards_dir, tmp_path, monkeypatch):
    from training import sft

    def no_model(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(sft, "build_model", no_model)
    with pytest.raises(PreflightError, match=r"train\.data\.max_seq_len=100: set train\.data\.max_seq_len=256"):
        sft.train(train_config(shards_dir, tmp_path / "ck", "train.data.max_seq_len=100"))
    with pytest.raises(PreflightError, match=r"train\.gpu_mem_gb=0\.5"):
        sft.train(train_config(shards_dir, tmp_path / "ck", "train.gpu_mem_gb=0.5"))
    assert not (tmp_path / "ck").exists()


def test_training_preflight_is_cheap_for_tiny(shards_dir, tmp_path):
    cfg = train_config(shards_dir, tmp_path / "ck")
    assert check_before_training(cfg).ok  # the first call pays transformers' imports, which training needs anyway
    start = time.perf_counter()
    report = check_before_training(cfg)
    assert time.perf_counter() - start < 1.0 and report.ok


def test_unknown_architecture_skips_in_training_but_fails_the_cli(capsys, caplog):
    cfg = _cfg(None, "train.model.base=nobody/unknown-vlm")
    assert check_before_training(cfg) is None
    assert "pre-flight skipped" in caplog.text
    assert run_cli(main, ["--params", str(PARAMS), "train.model.base=nobody/unknown-vlm"]) == 2
    assert "no architecture facts" in capsys.readouterr().err


def test_shape_true_bases_are_checked_from_their_cut_config_without_building():
    base = "shape-true:Qwen/Qwen2.5-VL-7B-Instruct?vocab=1024"
    report = preflight(_cfg("qwen25vl_7b_zero2_8gpu", f"train.model.base={base}"))
    assert report.ok and "shape-true" in report.arch_source and "own tokenizer" in report.tokenizer_note
    assert report.tokens.video_tokens == 2304  # the real geometry, one layer deep
    real = preflight(_cfg("qwen25vl_7b_zero2_8gpu"))
    assert report.params < real.params / 20 and report.configured.total_b < real.configured.total_b
