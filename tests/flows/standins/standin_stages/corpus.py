from pathlib import Path

from standin_stages import parse, write_json

args, cfg = parse("corpus")
out = Path(cfg.corpus.out_dir)
(out / "videos").mkdir(parents=True, exist_ok=True)
lines, truth = [], {}
for i in range(cfg.corpus.n_videos):
    vid = f"v{i:03d}"
    (out / "videos" / f"{vid}.mp4").write_bytes(f"video {vid} seed {cfg.corpus.seed}".encode())
    lines.append({"qid": i, "query": f"event {i}", "vid": vid, "duration": 20.0, "relevant_windows": [[2.0, 6.0]]})
    truth[vid] = [2.0, 6.0]
import json

(out / "annotations").mkdir(exist_ok=True)
(out / "annotations" / "qvhighlights.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
write_json(out / "ground_truth.json", truth)
print(f"stand-in corpus: {len(lines)} videos in {out}")
