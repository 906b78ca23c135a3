"""Deterministic synthetic grounding corpus: the embedded default data set and every stage's test bed.

`python -m corpus [--params P] [-e EXP] [--scale X] [--force] [key=value ...]` (or `build_corpus(cfg.corpus)`;
`load_ground_truth(out_dir)` reads the result back) writes, under
`corpus.out_dir`:

    videos/<video_id>.mp4                       real video files (mp4v, `corpus.fps`, 112x112 by default)
    annotations/<format>.<ext>                  one annotation file in a real format (`corpus.annotation_format`:
                                                qvhighlights .jsonl [default], charades .txt, activitynet .json,
                                                jsonl = native canonical jsonl)
    ground_truth.json                           what is really in the files (schema below)

Same `corpus.seed` (and config) -> byte-identical files; `corpus.workers` does not change the output.
Clean videos are several textured scenes (hard cuts; ~60% also have a ~1 s dissolve) in which 1-3 coloured
shapes each move or appear during one span (2-8 s) named by a query ("the red circle moves left"); outside
its span the queried object is absent, and a distractor of another colour may move. 10% of videos are long
(40-70 s); their events stay inside one scene. Text-answerable videos open with a title card (first ~2 s) or
end with credits (last 2-3 s), queried with fixed phrasings.

ground_truth.json (schema_version 1); times in seconds, frames 0-based, `[start, end)` unless noted:

    schema_version, generator_version, config_hash, config (the corpus section used, less out_dir/workers)
    annotation_format, annotation_file (relative to out_dir), annotation_lines (lines in that file)
    counts: {clean_videos, defective_videos}
    videos: [ {
        video_id, path (relative to out_dir), fps, n_frames, duration_s (= n_frames / fps), width, height,
        readable        false for truncated / zero_byte / not_video files (then n_frames, width, height and
                        duration_s describe the video the file was meant to hold, as its annotations do)
        bytes           size of the written file
        scenes          [{start_frame, end_frame, kind: texture|title|credits}], contiguous, covering [0, n_frames)
        hard_cuts       [frame]: first frame of a new scene after an abrupt cut
        gradual_transitions  [[first_frame, last_frame]] (inclusive) of each dissolve; the scene boundary it
                        straddles is in neither list of cuts
        events          [{annotation_id, query, kind: normal|text_answerable|duplicate_query|ambiguous_query,
                          start_s, end_s, start_frame, end_frame, color, shape, action (all but text_answerable),
                          of (duplicate_query: the annotation_id it repeats; same moment, same or near-same text;
                          ambiguous_query: the annotation_id whose object does the same action here again, same or
                          near-same text, another moment: both queries match two moments),
                          imprecise, annotated_start_s, annotated_end_s (only a query whose annotated window is
                          off the true one, `corpus.imprecise_fraction`: the mode early|late|wide|narrow and the
                          window the annotation file holds; start_s/end_s stay the true event)}]
        distractors     [{color, shape, action, start_s, end_s}] moving objects no query names
        defect          {kind: none} | {kind: blurred, sigma} | {kind: dark, gain} |
                        {kind: low_res, width, height, source_width, source_height} |
                        {kind: truncated, keep_fraction} | {kind: zero_byte} | {kind: not_video} |
                        {kind: near_duplicate, of: video_id, transform: {trim_start_frames, trim_start_s,
                         width, height, brightness, jpeg_quality}}  (events shifted by -trim_start_s, clipped at 0,
                         dropped if under 1 s)
      } ]
    invalid_annotations  [{line, annotation_id, video_id, raw, reason}]: lines ingest must dead-letter, with
                        the reason code of `ingest.reasons` (start_ge_end, negative_start, not_finite,
                        end_beyond_duration (+5 s), empty_query, missing_video, unparsable; and for the charades
                        format, which has no durations, unprobeable_video for the unreadable files' lines).
                        `line` is the 1-based line of the annotation file (activitynet: the video's line).
    clipped_annotations  [{line, annotation_id, video_id, end_s_written, end_s}]: valid lines whose end lies
                        0.1-0.4 s past the video's end; ingest clips them to the duration.

Every annotation line is either an event of some video (its annotation_id appears once in `videos[].events`)
or listed in `invalid_annotations` (charades: a line can be both, for unreadable videos).
"""

from corpus.build import GROUND_TRUTH, build_corpus, load_ground_truth
from corpus.plan import CREDITS_QUERIES, DEFECT_KINDS, INVALID_KINDS, TITLE_QUERIES

__all__ = ["CREDITS_QUERIES", "DEFECT_KINDS", "GROUND_TRUTH", "INVALID_KINDS", "TITLE_QUERIES", "build_corpus",
           "load_ground_truth"]
