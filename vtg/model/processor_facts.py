"""A checkpoint's processor facts: the vision tower's patch geometry, the pixel bounds of the resize (per frame or
per clip) and the mean/std, read from the processor configs beside the weights (`preprocessor_config.json`, and
`video_preprocessor_config.json` where the family publishes one). A checkpoint without them is an error, never a
silent default; every export keeps a copy (`save_processor_config`). `vtg.model.processing` builds the inputs
from these facts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from vtg.errors import VTGError
from vtg.model.families import CLIP_MEAN as _CLIP_MEAN
from vtg.model.families import CLIP_STD as _CLIP_STD
from vtg.model.families import DEFAULT, QWEN2_5_VL, Family, family_named, family_of
from vtg.model.geometry import Geometry

CLIP_MEAN = tuple(_CLIP_MEAN)
CLIP_STD = tuple(_CLIP_STD)
PROCESSOR_CONFIG = "preprocessor_config.json"
VIDEO_PROCESSOR_CONFIG = "video_preprocessor_config.json"
QWEN25VL_PROCESSOR = QWEN2_5_VL.processor
"""Qwen/Qwen2.5-VL-{3B,7B}-Instruct's `preprocessor_config.json` on the hub (its home: `vtg.model.families`): what
the tiny and shape-true builders write, so that their exports carry the processor facts a real checkpoint does."""


@dataclass(frozen=True)
class VisionParams:
    """The processor facts: the vision tower's patch geometry, the pixel bounds of the resize, and the mean/std.
    Defaults: Qwen2.5-VL's (`QWEN25VL_PROCESSOR`); a loaded model's come from its checkpoint (`from_model`)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 12845056
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    pixel_scope: str = "frame"
    """What min/max pixels bound: one `frame` (Qwen2.5-VL's image processor) or the whole `video` (t x h x w,
    Qwen3-VL's video processor)."""
    family: str = DEFAULT.name
    """The model family (`vtg.model.families`): how time reaches the model."""
    tokens_per_second: float = 2.0
    """Temporal rope ids per second of Qwen2.5-VL's native timing (the model config's
    `vision_config.tokens_per_second`; Qwen2.5-VL's published 2 where no model says)."""

    @property
    def model_family(self) -> Family:
        return family_named(self.family)

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.patch_size, self.merge_size, self.temporal_patch_size, self.min_pixels,
                        self.max_pixels, self.pixel_scope)

    @classmethod
    def for_family(cls, family: Family, **geometry) -> VisionParams:
        """The family's published facts (its video processor's where it has one), `geometry` overriding."""
        published = family.video_processor or family.processor
        vp = cls.from_processor_config(published, family.processor_source,
                                       "video" if family.video_processor else "frame")
        return dataclasses.replace(vp, family=family.name, **geometry)

    @classmethod
    def from_model_config(cls, config) -> VisionParams:
        """The patch geometry of a model config, the other facts its family's published ones: for models built
        in memory (tests, the GPU smoke test); a loaded checkpoint's facts come from `from_model`."""
        v = config.vision_config
        return cls.for_family(family_of(config), patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                              temporal_patch_size=v.temporal_patch_size, **_timing(config))

    @classmethod
    def from_processor_config(cls, data: dict, where: str = "preprocessor_config.json",
                              pixel_scope: str = "frame") -> VisionParams:
        """From a `preprocessor_config.json` (its keys: patch_size, merge_size, temporal_patch_size, image_mean,
        image_std, and min_pixels/max_pixels or, as transformers 5 writes them, size.shortest_edge/longest_edge)
        or a `video_preprocessor_config.json` (`pixel_scope="video"`: the bounds hold for t x h x w)."""
        size = data.get("size") if isinstance(data.get("size"), dict) else {}
        facts = {"patch_size": data.get("patch_size"), "merge_size": data.get("merge_size"),
                 "temporal_patch_size": data.get("temporal_patch_size"),
                 "min_pixels": data.get("min_pixels", size.get("shortest_edge")),
                 "max_pixels": data.get("max_pixels", size.get("longest_edge")),
                 "image_mean": data.get("image_mean"), "image_std": data.get("image_std")}
        missing = [k for k, v in facts.items() if v is None]
        if missing:
            raise VTGError(f"{where}: no {', '.join(missing)}: the processor facts must come from the checkpoint "
                           "(copy the base model's preprocessor_config.json next to the weights)")
        try:
            return cls(**{k: tuple(float(x) for x in v) if k.startswith("image_") else int(v)
                          for k, v in facts.items()}, pixel_scope=pixel_scope)
        except (TypeError, ValueError):
            raise VTGError(f"{where}: malformed processor facts {facts}") from None

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, config=None) -> VisionParams:
        """The facts in `<model_dir>/video_preprocessor_config.json` where the checkpoint has one (Qwen3-VL,
        Qwen3.5: bounds over the whole clip), else its `preprocessor_config.json` (a hub id: the files in the
        local Hugging Face cache), checked against `config`'s vision tower when given."""
        video = processor_config_path(model_dir, VIDEO_PROCESSOR_CONFIG)
        found = video or processor_config_path(model_dir)
        vp = (_facts_in(str(found), found.stat().st_mtime_ns, "video" if video else "frame")
              if found is not None else None)
        if vp is None:
            raise VTGError(f"{model_dir}: no {PROCESSOR_CONFIG}: the checkpoint's own processor facts (pixel bounds, "
                           "mean/std, patch sizes) are needed to build its inputs; copy the base model's "
                           f"{PROCESSOR_CONFIG} next to the weights (every export of this project writes one)")
        if config is not None:
            v = config.vision_config
            model = (v.patch_size, v.spatial_merge_size, v.temporal_patch_size)
            if (vp.patch_size, vp.merge_size, vp.temporal_patch_size) != model:
                raise VTGError(f"{found}: patch/merge/temporal patch {vp.patch_size}/{vp.merge_size}/"
                               f"{vp.temporal_patch_size}, but the model's vision tower has {'/'.join(map(str, model))}")
            family = family_of(config)
            if family.video_processor is not None and video is None:
                raise VTGError(f"{model_dir}: no {VIDEO_PROCESSOR_CONFIG}: a {family.name} checkpoint's video pixel "
                               f"bounds are in it; copy the base model's {VIDEO_PROCESSOR_CONFIG} next to the weights")
            vp = dataclasses.replace(vp, family=family.name, **_timing(config))
        return vp

    @classmethod
    def from_model(cls, model) -> VisionParams:
        """A loaded model's facts: the processor config beside the weights it was loaded from (for a LoRA
        model, its base's)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        return cls.from_checkpoint(getattr(config, "_name_or_path", "") or "", config)

    def to_processor_config(self) -> dict:
        """Qwen2.5-VL's `preprocessor_config.json` layout with these facts (per-frame bounds)."""
        return {**QWEN25VL_PROCESSOR, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                "patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge_size, "image_mean": list(self.image_mean), "image_std": list(self.image_std)}


def _timing(config) -> dict:
    """The rope timing facts of a model config (`tokens_per_second` where its vision tower has one)."""
    tps = getattr(config.vision_config, "tokens_per_second", None)
    return {"tokens_per_second": float(tps)} if tps else {}


def published_processor_files(family: Family, geometry: VisionParams | None = None) -> dict[str, dict]:
    """{file name: content} of the processor configs a checkpoint of `family` publishes (patch geometry from
    `geometry` when given: a tiny model's own), what the builders write beside the weights."""
    files = {PROCESSOR_CONFIG: dict(family.processor)}
    if family.video_processor is not None:
        files[VIDEO_PROCESSOR_CONFIG] = dict(family.video_processor)
    if geometry is not None:
        for data in files.values():
            data.update(patch_size=geometry.patch_size, merge_size=geometry.merge_size,
                        temporal_patch_size=geometry.temporal_patch_size)
    return files


@functools.lru_cache(maxsize=32)
def _facts_in(path: str, mtime_ns: int, pixel_scope: str = "frame") -> VisionParams:
    """A processor config file's facts, read once per file version (evaluation asks for them every batch)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise VTGError(f"{path}: unreadable ({e})") from None
    return VisionParams.from_processor_config(data, path, pixel_scope)


def processor_config_path(model_dir: str | Path, name: str = PROCESSOR_CONFIG) -> Path | None:
    """`<model_dir>/<name>`, or for a hub id its copy in the local Hugging Face cache."""
    if not str(model_dir):
        return None
    local = Path(model_dir) / name
    if local.is_file():
        return local
    if Path(model_dir).is_dir():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model_dir), name)
    except Exception:  # noqa: BLE001 - not a repo id: nothing cached under it
        return None
    return Path(cached) if isinstance(cached, str) else None


def save_processor_config(model, export_dir: str | Path) -> None:
    """Copy the model's processor configs into an export (`hf/`), so the export holds them like a hub
    checkpoint."""
    from vtg.io import write_json_atomic

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    source = getattr(base.config, "_name_or_path", "") or ""
    for name in (PROCESSOR_CONFIG, VIDEO_PROCESSOR_CONFIG):
        if (found := processor_config_path(source, name)) is not None:
            write_json_atomic(Path(export_dir) / name, json.loads(found.read_text()))
    if processor_config_path(source) is None:
        write_json_atomic(Path(export_dir) / PROCESSOR_CONFIG, VisionParams.from_model(model).to_processor_config())
