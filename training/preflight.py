"""`python -m training.preflight`: does the experiment's longest example fit, in tokens and in GPU memory?

    python -m training.preflight -e qwen25vl_7b_zero2_8gpu            # exit 0: OK, exit 2: FAIL (with the fix)
    python -m training.preflight -e qwen25vl_3b_lora_1gpu train.data.max_seq_len=1024 --json preflight.json

Needs no weights and no shards, and training runs the same check before it loads the model
(`check_before_training`), so a recipe that cannot fit stops before step 1 with the same message.

**Tokens.** The longest example the experiment can produce: the most frames preprocess samples from one window
(`preprocess.num_frames`, or `frame_fps` x `max_window_s`), at `preprocess.frame_size`, resized and patchified
as training does (`vtg.model.processing.frame_size_for`: the family's pixel bounds, per frame or per clip, with
the vision tower's patch x merge geometry from the model's config), with the chat scaffolding, the longest query ingest lets in (`ingest.max_query_tokens`, counted
with the same tokenizer: `vtg.model.tokens`) and the longest plausible answer for a `max_window_s` window
(`vtg.answer.format_answer`), assembled like `encode_example` (query position and timestamp mode from
`train.data`). Checked against `train.data.max_seq_len`.

The geometry comes from the model's config: `tiny` and local exports from their `config.json`, `shape-true:`
specs from their cut config, hub ids from the Hugging Face cache when the model was downloaded before, else
from the architecture facts in `vtg/model/archs/`. Local models count text with their own tokenizer (exact:
the test suite checks the count against `encode_example` on a real example). Hub ids count it with the local
tiny tokenizer plus Qwen's default system turn: the video tokens are exact, but that byte-level BPE (392 tokens)
splits English words far finer than Qwen's 151k-token vocabulary, which keeps most common words whole, so the
text part is an upper bound (a 40-word query is 137 tokens here, the system turn 26; Qwen's own tokenizer is
not available offline to count them exactly).

**Memory.** Per GPU for one micro-batch of the longest example: model states by ZeRO stage (`training/plan/`,
DeepSpeed's accounting, trainable parameters counted for LoRA / frozen vision, QLoRA's base weights at 4 bits) +
activations
(`training.activations.activation_bytes`: Korthikanti et al. 2022 per layer, the vision tower at its own token count,
the logits; with and without gradient checkpointing) + a reserve, against `train.gpu_mem_gb`.

**Verdict.** OK, or FAIL with one message naming the keys to change and values that fit (the smallest
`train.data.max_seq_len` step of 256 with 2% margin, or fewer frames; for memory the first of gradient
checkpointing, a higher ZeRO stage, a smaller micro-batch (same global batch), offload that fits).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.activations import Activations, activation_bytes, trainable_params
from training.arch import Arch, arch_for
from training.plan import GB, Setup, plan
from training.preflight_fix import fewer_frames, memory_fix
from training.sanity import SanityError, check_tokenizer
from vtg.answer import format_answer
from vtg.errors import VTGError
from vtg.model import shape_true
from vtg.model.modeling import resolve_base
from vtg.model.processing import (
    VisionParams,
    encode_prompt,
    frame_size_for,
    timestamp_mode,
    video_block,
    vision_tokens,
)
from vtg.model.tokens import counting_tokenizer

log = logging.getLogger("training.preflight")

SEQ_STEP = 256
SEQ_MARGIN = 0.02
RESERVE_GB = Setup.reserve_gb


class PreflightError(SanityError):
    """The recipe cannot fit: its longest example exceeds max_seq_len, or a GPU's memory."""


def longest_answer(window_s: float) -> str:
    """The answer with the most digits a window of `window_s` seconds allows (both ends near its end)."""
    ends = [(max(0.0, window_s - d), window_s) for d in (0.1, 1.5, window_s / 2)]
    return max((format_answer(s, e) for s, e in ends), key=len)


def max_frames(pcfg) -> int:
    """Most frames preprocess samples from one window (beam_jobs/frames.py: uniform at `frame_fps`, else the
    `num_frames` budget)."""
    if pcfg.frame_mode == "uniform" and pcfg.frame_fps > 0:
        return max(1, round(pcfg.max_window_s * pcfg.frame_fps))
    return pcfg.num_frames


@dataclass
class TokenCount:
    frames: int
    frame_size: int
    resized: tuple[int, int]
    grid: tuple[int, int, int]
    """(temporal groups, patch rows, patch columns) before the spatial merge."""
    video_tokens: int
    text_tokens: int
    """Everything else: chat scaffolding, query, per-group timestamps (text mode), answer + eos."""
    query_tokens: int
    answer: str

    @property
    def total(self) -> int:
        return self.video_tokens + self.text_tokens


def example_tokens(tokenizer, vision: VisionParams, *, frames: int, frame_size: int, window_s: float,
                   query_tokens: int, answer: str, timestamps: str, query_position: str,
                   system_prompt: str | None = None) -> TokenCount:
    """Length of the example `encode_example` would build for `frames` frames of frame_size x frame_size sampled
    uniformly over `window_s` seconds and a query of `query_tokens` tokens (`vtg.model.tokens.query_ids`: the
    prompt holds them between the template's parts), without decoding or patchifying any pixels (same template,
    video block, tokenizer calls)."""
    import torch

    h, w = frame_size_for(frames, frame_size, frame_size, vision)
    grid = (-(-frames // vision.temporal_patch_size), h // vision.patch_size, w // vision.patch_size)
    ts = [(i + 0.5) * window_s / frames for i in range(frames)]
    block, _, _ = video_block(vision_tokens(tokenizer), torch.tensor([grid]), ts, vision,
                               timestamp_mode(tokenizer, timestamps))
    n = len(encode_prompt(tokenizer, "", block, query_position, system_prompt)) + query_tokens
    n += len(tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"])
    video = grid[0] * grid[1] * grid[2] // vision.merge_size ** 2
    return TokenCount(frames, frame_size, (h, w), grid, video, n - video, query_tokens, answer)


def fitting_max_seq_len(tokens: int) -> int:
    """The smallest multiple of SEQ_STEP that holds `tokens` with SEQ_MARGIN to spare."""
    return SEQ_STEP * math.ceil(tokens * (1 + SEQ_MARGIN) / SEQ_STEP)


@dataclass
class MemoryOption:
    """Per-GPU bytes of one setting (model states + reserve + activations of one micro-batch)."""

    gradient_checkpointing: bool
    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    micro_batch: int
    model_states_b: float
    activations: Activations
    reserve_b: float

    @property
    def total_b(self) -> float:
        return self.model_states_b + self.activations.total_b + self.reserve_b


@dataclass
class Report:
    base: str
    arch_source: str
    tokenizer_note: str
    finetune: str
    precision: str
    strategy: str
    gpus: int
    gpu_mem_gb: float
    params: float
    trainable: float
    tokens: TokenCount
    max_seq_len: int
    micro_batch: int
    """Examples of the longest length one micro-batch can hold (micro_batch_size, or fewer under token_budget)."""
    configured: MemoryOption
    without_checkpointing: MemoryOption
    with_checkpointing: MemoryOption
    cpu_offload_gb: float
    token_budget: int = 0
    quantized: float = 0.0
    """QLoRA: elements of the base held in 4-bit (`vtg.model.quant`); 0 otherwise."""
    quantized_tensors: int = 0
    packing: bool = False
    """`train.data.packing`: a micro-batch's examples share rows; its tokens (at most token_budget) decide its
    activations as the padded batch's do (sdpa/flash: linear in tokens; eager rows are as long as the longest)."""
    problems: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    """Overrides that make the recipe fit (`key=value`), in the order the problems were found."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        return "OK" if self.ok else "FAIL"

    def message(self) -> str:
        return "pre-flight failed: " + "; ".join(self.problems)

    def summary(self) -> str:
        t, c = self.tokens, self.configured
        return (f"{self.verdict}: longest example {t.total:,} tokens ({t.video_tokens:,} video) vs "
                f"train.data.max_seq_len {self.max_seq_len:,}; {c.total_b / GB:.1f} of {self.gpu_mem_gb:g} GiB per GPU "
                f"(gradient checkpointing {'on' if c.gradient_checkpointing else 'off'}; "
                f"{self.without_checkpointing.total_b / GB:.1f} without, {self.with_checkpointing.total_b / GB:.1f} "
                "with)")

    def render(self) -> str:
        t, c = self.tokens, self.configured
        zero = "FSDP2 (as ZeRO-3)" if self.strategy == "fsdp" else f"ZeRO-{c.zero_stage}"
        off = (" + param/optimizer offload" if c.offload_param else
               " + optimizer offload" if c.offload_optimizer else "")
        lines = [
            (f"pre-flight  {self.base}: {self.finetune} fine-tuning, {self.precision}, {zero}{off}, "
             f"{self.gpus} x {self.gpu_mem_gb:g} GiB"),
            (f"  architecture  {self.arch_source}; {_count(self.params)} params"
             + (f" ({_count(self.quantized)} in 4-bit NF4)" if self.quantized else "")
             + f", {_count(self.trainable)} trainable"),
            f"  tokens    longest example {t.total:,} = {t.video_tokens:,} video + {t.text_tokens:,} text",
            (f"            video: {t.frames} frames at {t.frame_size} px -> {t.resized[0]}x{t.resized[1]}, grid "
             f"{t.grid[0]}x{t.grid[1]}x{t.grid[2]} patches / merge -> {t.video_tokens:,} tokens"),
            (f"            text: chat scaffolding, a {t.query_tokens}-token query (ingest.max_query_tokens), answer "
             f"{t.answer!r} + eos "
             f"({self.tokenizer_note})"),
            (f"            train.data.max_seq_len {self.max_seq_len:,}: "
             + ("OK" if t.total <= self.max_seq_len else "FAIL") + f" ({self.max_seq_len - t.total:+,} to spare)"),
            (f"  memory    per GPU, micro-batch {self.micro_batch} x {t.total:,} tokens" + (
                f" (train.data.token_budget {self.token_budget:,}" + (", packed" if self.packing else "") + ")"
                if self.token_budget else "") + " (GiB):"),
            (f"            model states {c.model_states_b / GB:.2f} + reserve {c.reserve_b / GB:.2f}"
             + (f"; optimizer/params offloaded to the CPU: {self.cpu_offload_gb:.1f} GiB per node"
                if self.cpu_offload_gb else "")),
        ]
        for name, o in (("without", self.without_checkpointing), ("with", self.with_checkpointing)):
            a = o.activations
            mark = "  <- configured" if o.gradient_checkpointing == c.gradient_checkpointing else ""
            lines.append(f"            {name + ' gradient checkpointing:':<33} activations {a.total_b / GB:6.2f} "
                         f"(text {a.text_b / GB:.2f}, vision {a.vision_b / GB:.2f}, logits {a.logits_b / GB:.2f}"
                         f", recompute {a.recompute_b / GB:.2f}) -> {o.total_b / GB:6.2f} per GPU{mark}")
        lines.append(f"            {c.total_b / GB:.2f} of {self.gpu_mem_gb:g} GiB: "
                     + ("OK" if c.total_b <= self.gpu_mem_gb * GB else "FAIL"))
        lines.append(f"  verdict   {self.verdict}")
        lines += [f"            {p}" for p in self.problems]
        if self.fix:
            lines.append(f"            fix: {' '.join(self.fix)}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        def option(o: MemoryOption) -> dict:
            d = {k: v for k, v in asdict(o).items() if k != "activations"}
            d.update(activations_b=o.activations.total_b, text_b=o.activations.text_b,
                     vision_b=o.activations.vision_b, logits_b=o.activations.logits_b,
                     recompute_b=o.activations.recompute_b, total_b=o.total_b, total_gib=o.total_b / GB)
            return d

        return {
            "verdict": self.verdict, "ok": self.ok, "problems": self.problems, "fix": self.fix,
            "base": self.base, "arch_source": self.arch_source, "tokenizer_note": self.tokenizer_note,
            "finetune": self.finetune, "precision": self.precision, "strategy": self.strategy, "gpus": self.gpus,
            "gpu_mem_gb": self.gpu_mem_gb, "params": self.params, "trainable_params": self.trainable,
            "quantized_params": self.quantized,
            "tokens": {**asdict(self.tokens), "total": self.tokens.total, "max_seq_len": self.max_seq_len},
            "memory": {"micro_batch": self.micro_batch, "token_budget": self.token_budget, "packing": self.packing,
                       "configured": option(self.configured),
                       "without_checkpointing": option(self.without_checkpointing),
                       "with_checkpointing": option(self.with_checkpointing),
                       "cpu_offload_gib_per_node": self.cpu_offload_gb},
        }


def _count(n: float) -> str:
    return next(f"{n / d:.3g}{u}" for d, u in ((1e9, "B"), (1e6, "M"), (1e3, "K"), (1, "")) if n >= d or d == 1)


class UnknownArchitecture(VTGError):
    """Nothing here knows the model's architecture (no local config, cache entry or facts file)."""


def _model(base: str) -> tuple[Arch, str, object, str, str | None]:
    """(arch, its source, tokenizer, tokenizer note, system prompt to add)."""
    found = arch_for(base)
    if found is None:
        raise UnknownArchitecture(
            f"train.model.base={base!r}: no architecture facts without weights (not `tiny`, a local export, a "
            "`shape-true:` spec, in the Hugging Face cache, or in vtg/model/archs/): add its config.json fields "
            "there (see vtg/model/shape_true.py)")
    arch, source, _ = found
    tokenizer, note, system = counting_tokenizer(base)  # the one ingest's query limit counts with
    if system is None:
        check_tokenizer(tokenizer)  # an export without a chat template fails here as in the sanity checks
    return arch, source, tokenizer, note, system


def processor_facts(base: str, arch: Arch) -> VisionParams:
    """The processor facts pre-flight resizes with: a local checkpoint's own (`tiny`, an export, a hub id in the
    cache: its processor configs); otherwise the architecture's patch geometry with its family's published pixel
    bounds and mean/std (`vtg.model.families`)."""
    from vtg.model.processing import processor_config_path

    if not shape_true.is_spec(base):
        where = resolve_base(base) if base == "tiny" else base
        if processor_config_path(where) is not None:
            return VisionParams.from_checkpoint(where)
    return VisionParams.for_family(arch.family, patch_size=arch.patch_size, merge_size=arch.merge_size,
                                   temporal_patch_size=arch.temporal_patch_size)


def preflight(cfg, query_tokens: int | None = None) -> Report:
    """Tokens and per-GPU memory of the experiment's longest example, and the verdict (see the module doc).
    `query_tokens`: the longest query, by default `ingest.max_query_tokens` (what ingest lets in)."""
    query_tokens = cfg.ingest.max_query_tokens if query_tokens is None else query_tokens
    t, e, p = cfg.train, cfg.engine, cfg.preprocess
    arch, source, tokenizer, note, system = _model(t.model.base)
    vision = processor_facts(t.model.base, arch)

    def count(frames: int) -> TokenCount:
        return example_tokens(tokenizer, vision, frames=frames, frame_size=p.frame_size, window_s=p.max_window_s,
                              query_tokens=query_tokens, answer=longest_answer(p.max_window_s),
                              timestamps=t.data.timestamps, query_position=t.data.query_position,
                              system_prompt=system)

    tokens = count(max_frames(p))
    seq = tokens.total
    micro = t.micro_batch_size if not t.data.token_budget else max(1, min(t.micro_batch_size,
                                                                          t.data.token_budget // seq))
    total, largest = arch.param_count()
    trainable = trainable_params(arch, t.model.finetune, t.model.lora_r, t.model.freeze_vision)
    quantized, tensors = arch.quantized_count() if t.model.finetune == "qlora" else (0.0, 0)
    setup = Setup(params=total, largest_layer=largest, gpus_per_node=t.num_gpus, gpu_mem_gb=t.gpu_mem_gb,
                  precision=e.precision, trainable_frac=trainable / total, quantized=quantized,
                  quantized_tensors=tensors)
    patches = tokens.grid[0] * tokens.grid[1] * tokens.grid[2]
    fsdp = e.strategy == "fsdp"

    def option(gc: bool, stage: int, off_opt: bool, off_param: bool, m: int) -> MemoryOption:
        states = plan(setup, stage, off_opt, off_param)
        acts = activation_bytes(arch, seq, m, vision_patches=patches, vision_span=tokens.grid[1] * tokens.grid[2],
                                checkpointing=gc, precision=e.precision, train_vision=not t.model.freeze_vision,
                                eager=t.model.attn_implementation == "eager")
        return MemoryOption(gc, stage, off_opt, off_param, m, states.model_states_b, acts, RESERVE_GB * GB)

    current = (3, False, False) if fsdp else (t.zero_stage, e.offload_optimizer, e.offload_param)
    gc = t.model.gradient_checkpointing
    configured = option(gc, *current, micro)
    report = Report(
        base=t.model.base, arch_source=source, tokenizer_note=note, finetune=t.model.finetune,
        precision=e.precision, strategy=e.strategy, gpus=t.num_gpus, gpu_mem_gb=t.gpu_mem_gb, params=total,
        trainable=trainable, tokens=tokens, max_seq_len=t.data.max_seq_len, micro_batch=micro,
        token_budget=t.data.token_budget, packing=t.data.packing, quantized=quantized, quantized_tensors=tensors,
        configured=configured, without_checkpointing=option(False, *current, micro),
        with_checkpointing=option(True, *current, micro),
        cpu_offload_gb=plan(setup, *current).cpu_b / GB)

    if seq > t.data.max_seq_len:
        fit = fitting_max_seq_len(seq)
        alt = fewer_frames(p, max_frames(p), vision.temporal_patch_size, t.data.max_seq_len, count)
        report.problems.append(
            f"the longest example is {seq:,} tokens ({tokens.video_tokens:,} video: {tokens.frames} frames at "
            f"{p.frame_size} px) > train.data.max_seq_len={t.data.max_seq_len}: set train.data.max_seq_len={fit}"
            + (f" (or {alt})" if alt else ""))
        report.fix.append(f"train.data.max_seq_len={fit}")
    general = None
    mix = t.mix_sources()
    if any(m.suite for m in mix):
        from training.mix import longest_general

        frames = (cfg.evaluate.forgetting.num_frames, cfg.evaluate.forgetting.frame_size)
        general = longest_general(mix, frames, tokenizer, vision)
    if general and general[0] > t.data.max_seq_len:  # the replayed general items are examples too
        report.problems.append(f"the longest general-task item of train.data.mix ({general[1]}) is {general[0]:,} "
                               f"tokens > train.data.max_seq_len={t.data.max_seq_len}: set train.data.max_seq_len="
                               f"{fitting_max_seq_len(general[0])}")
        report.fix.append(f"train.data.max_seq_len={fitting_max_seq_len(general[0])}")
    if t.data.packing and not arch.family.packable:
        report.problems.append(f"train.data.packing=true: {arch.family.name} has linear-attention layers, whose "
                               "examples cannot share a packed row exactly: set train.data.packing=false (length "
                               "groups under train.data.token_budget cut the padding instead)")
        report.fix.append("train.data.packing=false")
    limit = t.gpu_mem_gb * GB
    if configured.total_b > limit:
        found = memory_fix(option, gc, current, micro, t.grad_accum, limit, fsdp,
                            seq if t.data.token_budget else 0)
        what = (f"one micro-batch ({micro} x {seq:,} tokens) needs {configured.total_b / GB:.1f} GiB per GPU "
                f"(model states {configured.model_states_b / GB:.1f} + activations "
                f"{configured.activations.total_b / GB:.1f} + reserve {RESERVE_GB:g}) > "
                f"train.gpu_mem_gb={t.gpu_mem_gb:g}")
        if found is None:
            report.problems.append(
                f"{what}, even with gradient checkpointing, ZeRO-3 with parameter + optimizer offload and "
                "micro-batch 1: add GPUs (train.num_gpus), train LoRA or QLoRA (train.model.finetune=lora or "
                "qlora), or use fewer frames (preprocess.num_frames) or a smaller model")
        else:
            overrides, fitted = found
            report.problems.append(f"{what}: set {' '.join(overrides)} (then {fitted.total_b / GB:.1f} GiB)")
            report.fix.extend(overrides)
    return report


def check_before_training(cfg) -> Report | None:
    """Training's pre-flight (before the model is built): raises PreflightError with the CLI's message when the
    recipe cannot fit, or when it trains QLoRA and this machine cannot run a 4-bit base (`vtg.model.quant`); logs
    and skips the fit when nothing here knows the model's architecture."""
    if cfg.train.model.finetune == "qlora":
        import torch

        from vtg.model import quant

        why = quant.unavailable("cuda" if torch.cuda.is_available() else "cpu")  # the device training uses
        if why:
            raise PreflightError(f"pre-flight failed: train.model.finetune=qlora: a 4-bit base cannot train here: "
                                 f"{why}")
    try:
        report = preflight(cfg)
    except UnknownArchitecture as e:
        log.warning("pre-flight skipped: %s", e)
        return None
    log.info("pre-flight %s", report.summary())
    if not report.ok:
        raise PreflightError(report.message())
    return report


def main(argv: list[str] | None = None) -> int:
    from vtg.cli_common import config_arg_parser, resolve_config

    parser = config_arg_parser("Pre-flight: the experiment's longest example in tokens vs train.data.max_seq_len, "
                               "and per-GPU memory (model states + activations) vs train.gpu_mem_gb, without "
                               "weights or shards. Exit 0: OK; 2: FAIL, with the overrides that fit.")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--query-tokens", type=int, default=None,
                        help="tokens of the longest query counted (default: ingest.max_query_tokens, the longest "
                             "that ingest lets in)")
    args = parser.parse_args(argv)
    report = preflight(resolve_config(args), query_tokens=args.query_tokens)
    print(report.render())
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if not report.ok:
        raise PreflightError(report.message())
    return 0


if __name__ == "__main__":
    from vtg.cli_common import run_cli

    sys.exit(run_cli(main))
