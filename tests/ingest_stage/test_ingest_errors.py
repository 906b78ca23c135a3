"""User errors are one line that names the file and says what to do; nothing is lost silently."""

import json

import pytest
from support.declared import declared_arg

from ingest import ingest
from ingest.__main__ import main as ingest_main
from vtg.cli_common import run_cli
from vtg.errors import VTGError


def test_missing_annotation_file(tmp_path, ingest_config):
    with pytest.raises(VTGError, match=r"nope\.jsonl: annotation file not found; set ingest.annotations"):
        ingest(ingest_config(tmp_path / "nope.jsonl"))


def test_undetectable_format_names_the_file_and_the_knob(tmp_path, ingest_config):
    ann = tmp_path / "weird.jsonl"
    ann.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(VTGError, match=r"weird\.jsonl: cannot tell the annotation format.*set ingest.format"):
        ingest(ingest_config(ann))
    txt = tmp_path / "notes.txt"
    txt.write_text("hello\n")
    with pytest.raises(VTGError, match="notes.txt"):
        ingest(ingest_config(txt))


def test_explicit_format_reads_any_extension(tmp_path, ingest_config):
    ann = tmp_path / "annotations.data"
    ann.write_text("a 0.0 1.0##hello\n")
    assert ingest(ingest_config(ann, format="charades"))["records"] == 1


def test_missing_video_root(tmp_path, ingest_config):
    ann = tmp_path / "x.txt"
    ann.write_text("a 0.0 1.0##hello\n")
    cfg = ingest_config(ann).model_copy(update={"video_root": str(tmp_path / "novideos")})
    with pytest.raises(VTGError, match="video root does not exist"):
        ingest(cfg)


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys, repo_root):
    code = run_cli(ingest_main, ["--params", str(repo_root / "params.yaml"),
                                 f"ingest.annotations=[{tmp_path / 'missing.txt'}]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "missing.txt" in err[0]


def test_cli_runs_and_summarises(tmp_path, capsys, repo_root, video_root):
    ann = tmp_path / "x.txt"
    ann.write_text("a 0.0 1.0##hello\na 2.0 1.0##bad\n")
    out = tmp_path / "o"
    code = ingest_main(["--params", str(repo_root / "params.yaml"), declared_arg(tmp_path),
                        f"ingest.annotations=[{ann}]",
                        f"ingest.video_root={video_root}", f"ingest.out={out / 'r.jsonl'}",
                        f"ingest.dead_letter={out / 'd.jsonl'}", f"ingest.summary={out / 's.json'}"])
    text = capsys.readouterr().out
    assert code == 0 and "start_ge_end 1" in text
    assert json.loads((out / "s.json").read_text())["inputs"] == 2


def test_unwritable_output_is_a_one_line_error(tmp_path, ingest_config):
    ann = tmp_path / "x.txt"
    ann.write_text("a 0.0 1.0##hello\n")
    (tmp_path / "afile").write_text("")
    cfg = ingest_config(ann).model_copy(update={"out": str(tmp_path / "afile" / "records.jsonl")})
    with pytest.raises(VTGError, match="afile"):
        ingest(cfg)
