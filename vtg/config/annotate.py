"""`annotate`: automatic annotation, the third data source (seed 000): a model proposes (query, window) pairs for
videos without annotations, a grounding model verifies each, and the accepted ones become records of an
`auto:<model digest>` source (`annotate/`, docs/stages.md#annotate)."""

from pydantic import Field

from vtg.config._base import NOT_OUTPUT, Section


class AnnotateTeachConfig(Section):
    steps: int = Field(1500, ge=1)
    """AdamW steps teaching a tiny base (`annotate.base`) dense captioning and grounding on the labelled train
    records (`proposer: taught`, `verifier: taught`)."""
    lr: float = Field(3e-3, gt=0, le=1)
    """Peak learning rate (linear warmup over the first tenth, then constant)."""
    batch_size: int = Field(16, ge=1)
    """Examples per step (half captioning, half grounding when both are taught)."""
    seed: int = 0
    """Seed of the teaching's example order and of the proposals' sampling."""


class AnnotateConfig(Section):
    enabled: bool = False
    """Run the annotator. false: the stage passes `records` through unchanged (and says so in its summary), so
    preprocess always reads `out`."""
    records: str = Field("data/interim/records.jsonl", json_schema_extra=NOT_OUTPUT)
    """Canonical records written by ingest (the stage's input)."""
    videos: list[str] = Field(default_factory=list)
    """Videos without annotations to annotate: files or directories (searched recursively for mp4, avi, mkv, webm,
    mov), each under a root of a source declared in `ingest.sources` (the auto records keep the video's source for
    its path and licence). A video that already has records is annotated by them, not by the model."""
    hide_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Measurement on labelled data: withhold the annotations of this share of the train-split videos (by a stable
    hash of the video id) and annotate those videos instead. The withheld records go to `withheld`, never to
    preprocess; the summary scores the accepted auto labels against them (precision at IoU >= 0.5)."""
    base: str = "tiny"
    """The base a `taught` annotator starts from (`tiny`, `tiny-qwen3_vl`, ...: the model-family layer); a tiny base
    is first taught `train.teach`'s general task (colours), as SFT's is: the stand-in for a real model's
    pre-training."""
    proposer: str = "taught"
    """Who proposes: `taught` (the base taught dense captioning on the labelled train records, cached like the tiny
    models) or a checkpoint path or hub id of a model that answers the captioning prompt
    (`annotate.captions.CAPTION_PROMPT`) with `<query>: <start> - <end> seconds` lines."""
    verifier: str = "taught"
    """Who re-localises each proposed query: `taught` (the taught annotator's grounding) or a grounding checkpoint
    (e.g. `checkpoints/sft/step-001500/hf`)."""
    teach: AnnotateTeachConfig = AnnotateTeachConfig()
    """Teaching the `taught` annotator."""
    num_frames: int = Field(16, ge=2)
    """Frames per video shown to the annotator (uniform over the whole video)."""
    frame_size: int = Field(56, ge=16)
    """Frames at about frame_size^2 pixels, aspect kept (as preprocess stores them)."""
    max_duration_s: float = Field(16.0, gt=0)
    """Longer videos are not annotated (`too_long` in `proposals`): the annotator sees the whole video at
    `num_frames` frames."""
    samples: int = Field(4, ge=0)
    """Sampled captionings per video besides the greedy one; a proposal's confidence is the share of them that
    propose the same query with a window of IoU >= `verify_iou` (0: confidence 1)."""
    temperature: float = Field(0.5, gt=0)
    """Sampling temperature of those captionings (default corpus, taught annotator: 1.0 accepted 14 of 848 proposals,
    0.5 accepted 87-115: at 1.0 the samples rarely agree on anything)."""
    verify_iou: float = Field(0.5, gt=0, le=1)
    """A proposal is accepted only if the verifier's window for its query has at least this IoU with it."""
    min_confidence: float = Field(0.25, ge=0, le=1)
    """... and at least this confidence (agreement across samples). Default corpus, SFT verifier: 0.25 accepted 201
    proposals at window precision 0.86, 0.5 accepted 61 at 0.82 (the verifier, not the agreement, sorts windows)."""
    max_new_tokens: int = Field(48, ge=8)
    """Token limit of a captioning."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", json_schema_extra=NOT_OUTPUT)
    """Where the annotator runs: `auto` = the GPU when there is one (bf16), else the CPU (fp32)."""
    batch_size: int = Field(16, ge=1)
    """Videos per generation batch (left padding: sampled tokens depend on the batch's layout, so it counts)."""
    out: str = Field("data/interim/annotated_records.jsonl", json_schema_extra=NOT_OUTPUT)
    """The records preprocess reads: the input records (less the withheld) and the accepted auto records."""
    proposals: str = Field("data/interim/auto_proposals.jsonl", json_schema_extra=NOT_OUTPUT)
    """Every proposal with its confidence, the verifier's window and IoU, and the verdict (accepted or the reason
    it was rejected); videos that got no proposal are listed with the reason."""
    withheld: str = Field("data/interim/annotate_withheld.jsonl", json_schema_extra=NOT_OUTPUT)
    """Records withheld by `hide_fraction` (kept, never lost: the truth the precision is measured on)."""
    summary: str = Field("data/interim/annotate_summary.json", json_schema_extra=NOT_OUTPUT)
    """Counts that reconcile (records in = passed + withheld; proposals = accepted + rejected), precision."""
    progress: bool = Field(True, json_schema_extra=NOT_OUTPUT)
    """Progress bars."""
