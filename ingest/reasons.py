"""Dead-letter reason codes (one vocabulary for ingest, its tests and the corpus ground truth)."""

UNPARSABLE = "unparsable"  # not the format's syntax, a missing/ill-typed field, no window
UNKNOWN_FORMAT = "unknown_format"  # valid JSON, but none of the known formats' fields
EMPTY_QUERY = "empty_query"
NOT_FINITE = "not_finite"  # NaN or infinite start/end
NEGATIVE_START = "negative_start"
START_GE_END = "start_ge_end"
MISSING_VIDEO = "missing_video"  # no file with this id under ingest.video_root (any common extension)
BAD_DURATION = "bad_duration"  # the annotation's duration is missing, non-finite or <= 0
UNPROBEABLE_VIDEO = "unprobeable_video"  # Charades only (no durations in the file): OpenCV cannot read the video
END_BEYOND_DURATION = "end_beyond_duration"  # end > duration + ingest.end_tolerance_s
DUPLICATE_ANNOTATION_ID = "duplicate_annotation_id"  # an earlier item already used this annotation id
PATH_OUTSIDE_ROOT = "path_outside_root"  # video (symlinks resolved) outside video_root and extra_video_roots
AMBIGUOUS_VIDEO = "ambiguous_video_id"  # the id names files in two folders of video_root: which one is meant?
QUERY_TOO_LONG = "query_too_long"  # more tokens than ingest.max_query_tokens (pre-flight's query budget)
UNDECLARED_SOURCE = "undeclared_source"  # a native record names a source that ingest.sources does not declare
VIDEO_OUTSIDE_SOURCE = "video_outside_source"  # the video lies under none of its source's declared roots
LICENCE_MISMATCH = "licence_mismatch"  # a native record's licence is not its declared source's

REASONS = (UNPARSABLE, UNKNOWN_FORMAT, EMPTY_QUERY, NOT_FINITE, NEGATIVE_START, START_GE_END, MISSING_VIDEO,
           BAD_DURATION, UNPROBEABLE_VIDEO, END_BEYOND_DURATION, DUPLICATE_ANNOTATION_ID, PATH_OUTSIDE_ROOT,
           AMBIGUOUS_VIDEO, QUERY_TOO_LONG, UNDECLARED_SOURCE, VIDEO_OUTSIDE_SOURCE, LICENCE_MISMATCH)
