"""The simulated engine's vision inputs: how many tokens an image becomes, how long the CPU
takes to preprocess it and the GPU to encode it. Pure: no I/O, no clock.

A vision-language model (Qwen2-VL here) sees an image as a grid of patches: the processor
resizes it to multiples of 28 pixels (14-pixel patches, merged 2 x 2) within [min_pixels,
max_pixels], and each 28 x 28 cell becomes one prompt token (HF Qwen2VLImageProcessor's
smart_resize). 448 x 448 -> 16 x 16 = 256 tokens; 1,024 x 768 -> 37 x 27 = 999 tokens.

Two costs come with an image, on two resources:

- CPU preprocessing in the engine's API server, before the request is scheduled: decode, resize,
  normalise. One image at a time (one frontend process), so under load it is a queue in front
  of the GPU. A torchvision-like (tensor) processor takes ``fast_preprocess_s_per_mpixel``; a
  PIL-like one 10x that (``SLOW_PROCESSOR_FACTOR``: the field report's "PIL-based processors were
  far slower"). ``omp_threads`` above the container's cores oversubscribes them: each extra
  thread per core adds ``OVERSUBSCRIPTION_PENALTY`` of the time (OMP_NUM_THREADS left at a
  64-core host's count in a 4-core container: 16 threads per core -> 1 + 0.2 x 15 = 4x slower).
- GPU time of the vision encoder (the ViT), in the step that starts the request's prefill;
  proportional to the image's tokens. The image's tokens are then prefilled as prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from capacity.units import image_tokens

SLOW_PROCESSOR_FACTOR = 10.0  # PIL-like processors vs torchvision-like ones, per image
OVERSUBSCRIPTION_PENALTY = 0.2  # extra preprocessing time per OMP thread beyond one per core
PROCESSORS = ("fast", "slow")

if TYPE_CHECKING:
    from engine_model.perf_model import EngineProfile


@dataclass(frozen=True)
class VisionProfile:
    patch_px: int  # pixels per side of one image token (patch x merge): 28 for Qwen2-VL
    min_pixels: int  # the processor resizes an image to at least this many pixels
    max_pixels: int  # ... and at most this many
    encoder_per_token_s: float  # GPU seconds of the vision encoder per image token, >= 0
    fast_preprocess_s_per_mpixel: float  # CPU seconds per megapixel, torchvision-like, >= 0
    preprocess_base_s: float  # CPU seconds per image whatever its size (decode setup), >= 0
    processor: str = "fast"  # "fast" (torchvision-like) or "slow" (PIL-like, 10x)
    omp_threads: int = 4  # OMP_NUM_THREADS of the engine, >= 1
    cpu_cores: int = 4  # cores of the engine's container, >= 1

    def __post_init__(self) -> None:
        if self.processor not in PROCESSORS:
            raise ValueError(f"processor must be one of {PROCESSORS}, got {self.processor!r}")
        if self.omp_threads < 1 or self.cpu_cores < 1 or self.patch_px < 1:
            raise ValueError("omp_threads, cpu_cores and patch_px must be >= 1")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {self.min_pixels}, {self.max_pixels}")

    def image_tokens(self, width: int, height: int) -> int:
        """Prompt tokens of one image: 448 x 448 -> 256 (capacity.units.image_tokens)."""
        return image_tokens(width, height, self.patch_px, self.min_pixels, self.max_pixels)

    def preprocess_s(self, width: int, height: int) -> float:
        """CPU seconds to preprocess one image on this processor and thread setting."""
        per_image = self.preprocess_base_s + self.fast_preprocess_s_per_mpixel * width * height / 1e6
        if self.processor == "slow":
            per_image *= SLOW_PROCESSOR_FACTOR
        threads_per_core = self.omp_threads / self.cpu_cores
        if threads_per_core > 1:
            per_image *= 1 + OVERSUBSCRIPTION_PENALTY * (threads_per_core - 1)
        return per_image

    def encoder_s(self, width: int, height: int) -> float:
        """GPU seconds of the vision encoder for one image."""
        return self.encoder_per_token_s * self.image_tokens(width, height)


def with_preprocessing(
    profile: EngineProfile, processor: str | None, omp_threads: int | None
) -> EngineProfile:
    """The profile with its vision preprocessing set (None: as the profile says); a text-only
    profile refuses the settings."""
    if processor is None and omp_threads is None:
        return profile
    if profile.vision is None:
        raise ValueError(f"profile {profile.name} has no vision encoder: no image processor to set")
    vision = replace(
        profile.vision,
        processor=processor or profile.vision.processor,
        omp_threads=omp_threads or profile.vision.omp_threads,
    )
    return replace(profile, vision=vision)
