"""Forgetting: the corpus's general-task suites, a tiny base taught them, and retention (checkpoint accuracy / base
accuracy) in every evaluation, its report and selection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.eval_fixtures import train_briefly

from corpus import build_corpus
from corpus.build import load_ground_truth
from corpus.general import (
    EVAL_ALL_FILE,
    EVAL_FILE,
    GENERAL_DIR,
    PRESENCE_MIN_GAP_S,
    TEACH_ALL_FILE,
    TEACH_FILE,
)
from evaluation.api import evaluate_checkpoint
from vtg.checkpoints import HF_DIR, finalize, temp_dir_for
from vtg.config import PipelineConfig, load_config
from vtg.errors import VTGError
from vtg.general_tasks import is_correct, read_suite
from vtg.model.modeling import resolve_base
from vtg.model.teach import taught_base
from vtg.selection import pick_best

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory, shards_dir):
    tmp = tmp_path_factory.mktemp("forget")
    mp = pytest.MonkeyPatch()
    mp.setenv("VTG_TINY_CACHE", str(tmp / "cache" / "tiny_models"))
    corpus = load_config("params.yaml", None, [f"corpus.out_dir={tmp / 'synthetic'}", "corpus.n_videos=160",
                                               "corpus.workers=1"]).corpus
    build_corpus(corpus)
    suite_dir = tmp / "synthetic" / GENERAL_DIR
    base = taught_base(resolve_base("tiny"), suite_dir / TEACH_ALL_FILE, steps=500, lr=3e-3, batch_size=16,
                       num_frames=8, frame_size=56)

    def checkpoint(step: int, grounding_steps: int) -> Path:
        root = tmp / "checkpoints" / "sft"
        t = temp_dir_for(root, step)
        shutil.copytree(base, t / HF_DIR)
        if grounding_steps:
            train_briefly(t / HF_DIR, shards_dir, grounding_steps)
        from vtg.shards import data_version

        meta = {"step": step, "data_version": data_version(shards_dir), "git_commit": "test", "config_hash": "cfg",
                "finetune": "full", "base": "tiny", "base_path": str(base)}
        return finalize(root, step, meta, {"fixture": True}, keep_last=10)

    ckpts = [checkpoint(0, 0), checkpoint(200, 200)]
    cfg = PipelineConfig.model_validate({
        "evaluate": {"shards_dir": str(shards_dir), "out_dir": str(tmp / "eval"), "store_dir": str(tmp / "store"),
                     "batch_size": 8, "max_new_tokens": 12, "device": "cpu", "baselines": [],
                     "forgetting": {"suite": str(suite_dir / EVAL_ALL_FILE)}},
        "tracking": {"enabled": False}})
    yield {"tmp": tmp, "base": base, "suite": suite_dir, "ckpts": ckpts, "cfg": cfg}
    mp.undo()


def test_the_corpus_writes_teach_and_eval_suites_on_disjoint_videos(world):
    teach, held = read_suite(world["suite"] / TEACH_FILE), read_suite(world["suite"] / EVAL_FILE)
    assert len(teach) > 3 * len(held) > 0
    assert {Path(i.video).name for i in teach}.isdisjoint({Path(i.video).name for i in held})
    assert all(i.task == "color" and i.answer in i.choices and Path(i.video).is_file() for i in teach + held)
    report = json.loads((world["base"] / "teach_report.json").read_text())
    assert report["last10_loss"] < 0.5 * report["first10_loss"]


def test_the_presence_task_is_balanced_and_its_no_clips_show_no_object(world):
    """`presence`: as many `no` as `yes` items per video; a `yes` clip is an ordinary event's, a `no` clip lies
    inside a stretch with no event or distractor; `*_all` files are the colour files followed by presence."""
    truth = load_ground_truth(world["tmp"] / "synthetic")
    videos = {Path(v["path"]).name: v for v in truth["videos"]}
    for all_file, color_file in ((TEACH_ALL_FILE, TEACH_FILE), (EVAL_ALL_FILE, EVAL_FILE)):
        text, color = (world["suite"] / all_file).read_text(), (world["suite"] / color_file).read_text()
        assert text.startswith(color) and len(text) > len(color)
        items = [i for i in read_suite(world["suite"] / all_file) if i.task == "presence"]
        per_video: dict[str, list[str]] = {}
        for i in items:
            per_video.setdefault(Path(i.video).name, []).append(i.answer)
            v = videos[Path(i.video).name]
            busy = [(o["start_s"], o["end_s"]) for o in v["events"] + v["distractors"]]
            if i.answer == "no":
                assert not any(min(i.end_s, b) > max(i.start_s, a) for a, b in busy), i.id
            else:
                assert any(e["kind"] == "normal" and (e["start_s"], e["end_s"]) == pytest.approx((i.start_s, i.end_s),
                           abs=1e-3) for e in v["events"]), i.id
        assert per_video and all(a.count("yes") == a.count("no") for a in per_video.values())
    assert PRESENCE_MIN_GAP_S > 0


def test_retention_is_reported_per_task_and_selection_can_require_it(world):
    cfg = world["cfg"]
    taught, grounded = (evaluate_checkpoint(c, "val", cfg, refresh=False) for c in world["ckpts"])
    for res in (taught, grounded):
        forgetting = res.result["summary"]["forgetting"]
        assert set(forgetting["tasks"]) == {"color", "presence"}
        color = forgetting["tasks"]["color"]
        assert color["n"] == len(read_suite(world["suite"] / EVAL_FILE))
        ratios = [t["retention"] for t in forgetting["tasks"].values()]
        assert forgetting["min_retention"] == min(ratios)
        assert forgetting["mean_retention"] == pytest.approx(sum(ratios) / 2)
        assert color["ci"][0] <= color["accuracy"] <= color["ci"][1]
        assert color["retention"] == pytest.approx(color["accuracy"] / color["base_accuracy"])
        answers = [json.loads(x) for x in (res.entry_dir / "general_answers.jsonl").read_text().splitlines()]
        answers = [a for a in answers if a["task"] == "color"]
        assert len(answers) == color["n"] and sum(a["correct"] for a in answers) == round(color["accuracy"] * color["n"])
    t = taught.result["summary"]["forgetting"]
    g = grounded.result["summary"]["forgetting"]
    for task in ("color", "presence"):
        print(f"{task}: taught base accuracy {t['tasks'][task]['base_accuracy']:.3f}; after 200 grounding steps "
              f"{g['tasks'][task]['accuracy']:.3f} (retention {g['tasks'][task]['retention']:.2f})")
    # 500 teaching steps on ~400 items of two tasks: well above chance on held-out videos (colours 1 in 8, presence
    # 1 in 2; make run: 0.98 on both)
    assert t["tasks"]["color"]["base_accuracy"] > 0.3, "the taught base answers the held-out colour questions"
    assert t["tasks"]["presence"]["base_accuracy"] > 0.7, "the taught base sees whether a shape is on screen"
    assert "overall (lowest / mean of the tasks)" in taught.report.read_text()
    assert t["min_retention"] == pytest.approx(1.0)  # the base itself keeps everything
    assert g["min_retention"] < 0.9 and g["warnings"] and "retention" in g["warnings"][0]
    html = grounded.report.read_text()
    assert "General-task retention (forgetting)" in html and "grounding training is erasing it" in html
    # selection: by eval loss the grounded checkpoint wins; requiring retention >= 0.9 keeps only the base
    results = [taught.result, grounded.result]
    assert pick_best(results, "eval_loss")["step"] == 200
    assert pick_best(results, "eval_loss", min_retention=0.9)["step"] == 0


def test_the_base_is_asked_as_the_checkpoint_is(world, tmp_path):
    """Retention compares answers to the same prompts: a checkpoint that asks with the query before the video
    (what SFT exports record, `train.data.query_position`) has its base asked that way too. The taught base's own
    weights, exported with that setting, keep exactly 1.0 (asked the base's way, they scored 0.00 colour: the
    prompt order read as forgetting)."""
    from vtg.model.processing import QUERY_POSITION_KEY

    taught = json.loads((world["base"] / "tokenizer_config.json").read_text())
    assert taught[QUERY_POSITION_KEY] == "after"  # the taught base records how it was taught
    root = tmp_path / "checkpoints" / "sft"
    t = temp_dir_for(root, 1)
    shutil.copytree(world["base"], t / HF_DIR)
    config = t / HF_DIR / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), QUERY_POSITION_KEY: "before"}))
    meta = {"step": 1, "data_version": json.loads((world["ckpts"][0] / "meta.json").read_text())["data_version"],
            "git_commit": "test", "config_hash": "cfg", "finetune": "full", "base": "tiny",
            "base_path": str(world["base"])}
    ckpt = finalize(root, 1, meta, {"fixture": True}, keep_last=10)
    res = evaluate_checkpoint(ckpt, "val", world["cfg"], refresh=False)
    forgetting = res.result["summary"]["forgetting"]
    assert forgetting["asked"] == {"query_position": "before", "timestamps": "native"}
    assert forgetting["min_retention"] == pytest.approx(1.0), forgetting["tasks"]


def test_the_evaluate_stage_names_the_front_and_draws_the_plane(world):
    """The real evaluate stage over the taught base (step 0) and the grounded checkpoint: by eval loss the grounded
    one grounds better and the base keeps more, so both are on the front; the retention floor chooses the base."""
    from evaluation.stage import run_stage

    out = world["tmp"] / "stage"
    cfg = world["cfg"].model_copy(update={
        "train": world["cfg"].train.model_copy(update={"out_dir": str(world["tmp"] / "checkpoints" / "sft")}),
        "orchestration": world["cfg"].orchestration.model_copy(update={"rl": False}),
        "evaluate": world["cfg"].evaluate.model_copy(update={
            "out_dir": str(out), "select_metric": "eval_loss",
            "forgetting": world["cfg"].evaluate.forgetting.model_copy(update={"min_for_selection": 0.9})})})
    digest = run_stage(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    pareto = metrics["pareto"]
    assert pareto == digest["pareto"] and pareto["split"] == "val" and pareto["x"] == "eval_loss"
    assert pareto["front"] == ["sft/step-000200", "sft/step-000000"] and pareto["chosen"] == "sft/step-000000"
    assert digest["best_step"] == 0 and pareto["floor"] == 0.9
    base = next(p for p in pareto["points"] if p["step"] == 0)
    assert base["retention"] == pytest.approx(1.0) and base["retention_ci"][0] <= 1.0 <= base["retention_ci"][1]
    html = (out / "report.html").read_text()
    assert "Grounding and retention (val)" in html and 'src="pareto.png"' in html and (out / "pareto.png").is_file()
    assert "sft/step-000000 (chosen)" in (out / "summary.md").read_text()


def test_max_items_keeps_the_first_items_of_every_task(world):
    from evaluation.forgetting import suite_items

    cfg = world["cfg"].evaluate
    short = cfg.model_copy(update={"forgetting": cfg.forgetting.model_copy(update={"max_items": 3})})
    items, why = suite_items(short)
    everything = read_suite(world["suite"] / EVAL_ALL_FILE)
    assert why is None and [i.id for i in items] == ([i.id for i in everything if i.task == "color"][:3]
                                                      + [i.id for i in everything if i.task == "presence"][:3])


def test_bad_suite_lines_are_errors_that_name_the_line(tmp_path):
    path = tmp_path / "suite.jsonl"
    good = {"id": "a", "task": "t", "image": "x.png", "question": "q?", "answer": "yes", "choices": ["yes", "no"]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "answer": "maybe"}) + "\n")
    with pytest.raises(VTGError, match=r"suite.jsonl:2: .*not one of the choices"):
        read_suite(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "video": "v.mp4"}) + "\n")
    with pytest.raises(VTGError, match=r"suite.jsonl:2: .*exactly one of `video` and `image`"):
        read_suite(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(VTGError, match="appears twice"):
        read_suite(path)
    [item] = read_suite(_one(path, good))
    assert is_correct(" Yes.", item) and not is_correct("yes no", item)


def _one(path: Path, item: dict) -> Path:
    one = path.with_name("one.jsonl")
    one.write_text(json.dumps(item) + "\n")
    return one
