"""Named performance profiles for the simulated engine.

These are order-of-magnitude stand-ins for a GPU, not measurements of ours. Each number is
derived from public hardware specifications and the shape of public vLLM serving results for
Llama-3.1-8B-Instruct in BF16, with the arithmetic written out so that anyone can redo it or
replace a number with a benchmark result (the capacity benchmark will do that for real GPUs).

Common facts (Llama-3.1-8B): ~8.0e9 parameters -> 16 GB of BF16 weights and ~16 GFLOP per
token (2 x params); KV cache per token = 2 (K,V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
= 128 KiB. Decode is bound by reading the weights once per step, so the fixed step cost is
about weights / memory bandwidth plus ~1-1.5 ms of scheduling, sampling and launch overhead;
each extra sequence adds its KV reads and a little compute. Prefill is compute bound; we
assume ~40-45 % of dense BF16 peak. vLLM's published Llama-8B results on an H100 show inter-
token latencies of roughly 6-8 ms at low concurrency rising to ~15-25 ms with hundreds of
sequences, and TTFT of ~0.1 s for 2k-token prompts when unloaded; the H100 numbers below land
there. (The issue's "thousands of tokens per ms" for prefill would be ~1e6 tokens/s, beyond
any single GPU's FLOPs; tens of thousands of tokens per second is what the arithmetic allows.)
Token budget and sequence cap follow vLLM V1 serving defaults as we understand them
(max_num_batched_tokens 8192, max_num_seqs 256); deployments tune both.
"""

from __future__ import annotations

from dataclasses import replace

from engine_model.perf_model import EngineProfile
from engine_model.vision import VisionProfile

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
QWEN2_VL_7B = "Qwen/Qwen2-VL-7B-Instruct"

# H100 SXM 80 GB: 3.35 TB/s HBM3, 989 TFLOPS dense BF16.
H100_LLAMA_8B = EngineProfile(
    name="h100-llama-8b",
    model=LLAMA_8B,
    # 16 GB / 3.35 TB/s = 4.8 ms of weight reads + ~1.2 ms overhead.
    step_base_s=0.006,
    # 60 us per sequence: batch 64 -> 6 + 3.8 = 9.8 ms/step, batch 256 -> 21.4 ms/step.
    decode_per_seq_s=0.000_06,
    # 40 us/token = 25k tokens/s = 400 TFLOPS (40 % of peak); 2,000-token prompt -> 86 ms TTFT.
    prefill_per_token_s=0.000_04,
    max_batched_tokens=8192,
    max_num_seqs=256,
    # 0.9 x 80 GB - 16 GB weights - ~4 GB activations = ~52 GB / 128 KiB = ~400k tokens.
    kv_capacity_tokens=400_000,
    max_model_len=8192,  # as deployed with --max-model-len 8192 (the model allows 128k)
)

# L40S 48 GB: 864 GB/s GDDR6, 362 TFLOPS dense BF16.
L40S_LLAMA_8B = EngineProfile(
    name="l40s-llama-8b",
    model=LLAMA_8B,
    # 16 GB / 864 GB/s = 18.5 ms of weight reads + ~1.5 ms overhead.
    step_base_s=0.020,
    # ~3.9x less bandwidth than H100 for KV reads: 60 us x 3.3 ~ 200 us per sequence;
    # batch 64 -> 20 + 12.8 = 32.8 ms/step.
    decode_per_seq_s=0.000_2,
    # 100 us/token = 10k tokens/s = 160 TFLOPS (44 % of peak); 2,000-token prompt -> 220 ms.
    prefill_per_token_s=0.000_1,
    max_batched_tokens=8192,
    max_num_seqs=256,
    # 0.9 x 48 GB - 16 GB weights - ~3 GB activations = ~24 GB / 128 KiB = ~180k tokens.
    kv_capacity_tokens=180_000,
    max_model_len=8192,
)

# Llama-3.1-70B on 4 x H100 SXM with tensor parallelism 4 (the demo's gpus_per_replica 4).
# 70.6e9 parameters -> 141 GB of BF16 weights, 35.3 GB per GPU; ~141 GFLOP per token; KV per
# token = 2 x 80 layers x 8 KV heads x 128 dims x 2 bytes = 320 KiB (2.5x the 8B's).
H100X4_LLAMA_70B = EngineProfile(
    name="h100x4-llama-70b",
    model=LLAMA_70B,
    # 35.3 GB / 3.35 TB/s = 10.5 ms of weight reads per GPU (all four in parallel) + ~1.5 ms
    # overhead + ~1.5 ms of tensor-parallel all-reduces (2 per layer x 80 layers x ~10 us).
    step_base_s=0.0135,
    # Per sequence: 2.5x the 8B's KV reads and 8.8x its FLOPs, spread over 4 GPUs: ~1.7x the 8B's
    # 60 us -> 100 us; batch 64 -> 13.5 + 6.4 = 19.9 ms/step (about 50 tokens/s per sequence).
    decode_per_seq_s=0.000_1,
    # 141 GFLOP/token / (4 x 989 TFLOPS x 40 %) = 89 us/token; 2,000-token prompt -> 190 ms TTFT.
    prefill_per_token_s=0.000_09,
    max_batched_tokens=8192,
    max_num_seqs=256,
    # 4 x 0.9 x 80 GB = 288 GB - 141 GB weights - ~4 x 4 GB activations = 131 GB / 320 KiB
    # = ~400k tokens: the same KV room as the 8B on one H100, shared by a batch 2.5x dearer.
    kv_capacity_tokens=400_000,
    max_model_len=8192,
)

# Qwen2-VL-7B-Instruct on one H100 SXM: a vision-language model. 7.6e9 LLM parameters + a 675M
# ViT -> 16.6 GB of BF16 weights; ~15 GFLOP per prompt token (2 x 7.6e9); KV per token = 2 x 28
# layers x 4 KV heads x 128 dims x 2 bytes = 56 KiB (GQA: under half the Llama 8B's).
H100_QWEN2_VL_7B_VISION = EngineProfile(
    name="h100-qwen2-vl-7b-vision",
    model=QWEN2_VL_7B,
    # 16.6 GB / 3.35 TB/s = 5.0 ms of weight reads + ~1.2 ms overhead.
    step_base_s=0.0062,
    # Per sequence: KV reads of 56 KiB per token of context, under half the 8B's: 45 us.
    decode_per_seq_s=0.000_045,
    # 15.2 GFLOP/token / (989 TFLOPS x 40 %) = 38 us/token; a 448 x 448 image's 256 tokens -> 9.7 ms.
    prefill_per_token_s=0.000_038,
    max_batched_tokens=8192,
    max_num_seqs=256,
    # 0.9 x 80 GB - 16.6 GB weights - ~4 GB activations = ~51 GB / 56 KiB = ~900k tokens.
    kv_capacity_tokens=900_000,
    max_model_len=8192,  # --max-model-len 8192 (the model allows 32k)
    vision=VisionProfile(
        patch_px=28,  # 14-pixel patches merged 2 x 2: one token per 28 x 28 pixels
        min_pixels=56 * 56,  # Qwen2VLImageProcessor's defaults
        max_pixels=28 * 28 * 1280,  # vLLM's recommended cap for serving: 1,280 tokens an image
        # ViT: 2 x 675M = 1.35 GFLOP per 14-pixel patch, 4 patches per token = 5.4 GFLOP/token, at
        # ~30 % of peak (smaller matmuls than the LLM's, full attention within the image) = 18 us.
        encoder_per_token_s=0.000_018,
        # torchvision on tensors, 4 threads: JPEG decode ~5 ms/MP + resize and normalise ~3 ms/MP;
        # ~1 ms per image to set up. A PIL-based processor: 10x (vision.SLOW_PROCESSOR_FACTOR).
        fast_preprocess_s_per_mpixel=0.008,
        preprocess_base_s=0.001,
        processor="fast",
        omp_threads=4,  # OMP_NUM_THREADS set to the container's cores, not the host's
        cpu_cores=4,
    ),
)

# A small engine for tests: few slots and a small KV cache so that saturation and queueing
# happen with a handful of requests; slow enough per step that timings are measurable at a
# large --time-scale. Not a model of any hardware.
TINY_TEST = EngineProfile(
    name="tiny-test",
    model="sim-tiny",
    step_base_s=0.010,
    decode_per_seq_s=0.001,
    prefill_per_token_s=0.000_1,
    max_batched_tokens=512,
    max_num_seqs=4,
    kv_capacity_tokens=2048,
    max_model_len=512,
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (H100_LLAMA_8B, H100X4_LLAMA_70B, L40S_LLAMA_8B, H100_QWEN2_VL_7B_VISION, TINY_TEST)
}


def get_profile(name: str, model: str | None = None) -> EngineProfile:
    """The named profile, optionally serving under another model name."""
    try:
        profile = PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}; known: {known}") from None
    return replace(profile, model=model) if model else profile
