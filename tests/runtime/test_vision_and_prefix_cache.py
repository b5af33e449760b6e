"""The simulated engine's vision inputs and prefix cache, worked by hand: an image's tokens, its
CPU preprocessing (fast or slow processor, OMP threads) and its GPU encoder time, and prompt
blocks found in the prefix cache skipping prefill."""

from __future__ import annotations

import json

import pytest

from dataplane.runtime.prefix_cache import PrefixCache
from engine_model import perf_model as pm
from engine_model.profiles import H100_QWEN2_VL_7B_VISION, PROFILES
from engine_model.vision import with_preprocessing
from tests.image_files import data_url, image_part, png
from tests.runtime.support import http, sim_engine

VL = H100_QWEN2_VL_7B_VISION
VISION = VL.vision
assert VISION is not None


def test_the_vision_profile_is_listed_and_says_its_image_costs():
    assert "h100-qwen2-vl-7b-vision" in PROFILES
    assert VISION.image_tokens(448, 448) == 256
    # encoder: 256 tokens x 18 us = 4.608 ms of GPU
    assert VISION.encoder_s(448, 448) == pytest.approx(0.004608)
    # torchvision-like: 1 ms + 8 ms/MP x 0.2007 MP = 2.606 ms of CPU; PIL-like 10x
    assert VISION.preprocess_s(448, 448) == pytest.approx(0.001 + 0.008 * 0.200704)
    slow = with_preprocessing(VL, "slow", None).vision
    assert slow is not None and slow.preprocess_s(448, 448) == pytest.approx(
        10 * VISION.preprocess_s(448, 448)
    )
    # OMP_NUM_THREADS 64 (the host's) in the 4-core container: 16 threads a core -> 1 + 0.2 x 15 = 4x
    crowded = with_preprocessing(VL, None, 64).vision
    assert crowded is not None and crowded.preprocess_s(448, 448) == pytest.approx(
        4 * VISION.preprocess_s(448, 448)
    )
    with pytest.raises(ValueError, match="no vision encoder"):
        with_preprocessing(PROFILES["tiny-test"], "slow", None)


def test_an_image_waits_for_the_cpu_then_its_encoder_runs_in_its_first_prefill_step():
    # 8 text + 256 image tokens, 1 out, alone: the GPU idles 2.606 ms while the CPU preprocesses,
    # then one step: 6.2 ms + 264 x 38 us + 4.608 ms encoder = 20.84 ms -> first token at 23.45 ms.
    r = pm.SimRequest(
        "a", 264, 1, encoder_s=VISION.encoder_s(448, 448), preprocess_s=VISION.preprocess_s(448, 448)
    )
    [done] = pm.simulate(VL, [pm.Arrival(0.0, r)])
    cpu = 0.001 + 0.008 * 0.200704
    assert done.first_token_s == pytest.approx(cpu + 0.0062 + 264 * 0.000038 + 0.004608)


def test_a_slow_processor_bounds_throughput_by_the_cpu():
    # 200 requests of one 448 x 448 image, 8 text tokens, 1 out, all at once. Each takes 14.64 ms
    # of GPU (4.608 ms encoder + 264 x 38 us prefill) and 2.61 ms of CPU (fast) or 26.06 ms (slow).
    # Fast: the GPU bounds them, 200 x 14.64 = 2.93 s (+ the steps' base); slow: the CPU does,
    # 200 x 26.06 = 5.21 s (+ the last one's step): 1.8x longer on the same GPU.
    def finish_s(profile: pm.EngineProfile) -> float:
        v = profile.vision
        assert v is not None
        enc, pre = v.encoder_s(448, 448), v.preprocess_s(448, 448)
        arrivals = [
            pm.Arrival(0.0, pm.SimRequest(f"r{i}", 264, 1, encoder_s=enc, preprocess_s=pre))
            for i in range(200)
        ]
        return max(c.finished_s for c in pm.simulate(profile, arrivals))

    gpu, cpu = 200 * (0.004608 + 264 * 0.000038), 200 * (0.001 + 0.008 * 0.200704)
    fast, slow = finish_s(VL), finish_s(with_preprocessing(VL, "slow", None))
    assert gpu <= fast < gpu + 0.1
    assert 10 * cpu <= slow < 10 * cpu + 0.03
    assert slow / fast > 1.7


def test_cached_prompt_tokens_are_not_prefilled():
    # 2,048-token prompt, 1,024 cached: TTFT 6.2 ms + 1,024 x 38 us = 45.1 ms, not 84.0 ms.
    [cold] = pm.simulate(VL, [pm.Arrival(0.0, pm.SimRequest("a", 2048, 1))])
    [warm] = pm.simulate(VL, [pm.Arrival(0.0, pm.SimRequest("b", 2048, 1, cached_tokens=1024))])
    assert cold.first_token_s == pytest.approx(0.0062 + 2048 * 0.000038)
    assert warm.first_token_s == pytest.approx(0.0062 + 1024 * 0.000038)
    # all of it cached: the last token is still computed, to sample from
    [full] = pm.simulate(VL, [pm.Arrival(0.0, pm.SimRequest("c", 2048, 1, cached_tokens=2048))])
    assert full.first_token_s == pytest.approx(0.0062 + 0.000038)


def test_the_prefix_cache_hits_whole_blocks_of_a_shared_prefix():
    cache = PrefixCache(capacity_blocks=100)
    shared = list(range(70))
    assert cache.lookup(shared + list(range(1000, 1030))) == 0  # first seen
    assert cache.lookup(shared + list(range(2000, 2030))) == 64  # 4 whole blocks of the 70 shared
    same = shared + list(range(2000, 2030))
    assert cache.lookup(same) == 96  # 6 whole blocks; the 7th (96..99) is partial
    assert cache.lookup(list(range(32))) == 16  # all cached, less the last token's block
    assert (cache.queries, cache.hits) == (332, 176)  # vllm:prefix_cache_queries / _hits


def test_prompts_of_different_cache_salts_share_no_cached_block():
    """vLLM keys the first block's hash with the salt and chains the rest to it."""
    cache = PrefixCache(capacity_blocks=100)
    prompt = list(range(100))
    assert cache.lookup(prompt, "tenant-a") == 0
    assert cache.lookup(prompt, "tenant-b") == 0  # no block of a's, not even the later ones
    assert cache.lookup(prompt) == 0  # nor the unsalted prompt's
    assert cache.lookup(prompt, "tenant-a") == 96  # the same salt: as without salts
    assert cache.lookup(prompt, "") == 96  # "" is no salt (vLLM: `if request.cache_salt`)
    assert cache.lookup(prompt[:40] + [7] * 60, "tenant-b") == 32  # a shared prefix, one salt


def test_the_prefix_cache_evicts_least_recently_used_blocks():
    cache = PrefixCache(capacity_blocks=2)
    a, b = list(range(32)), list(range(100, 132))
    cache.lookup(a)
    cache.lookup(b)  # 4 blocks seen, 2 kept: b's
    assert cache.lookup([*b, 0]) == 32  # b's kept
    assert cache.lookup([*a, 0]) == 0  # a's were evicted


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.stack
def test_the_http_engine_takes_images_on_a_vision_profile_and_counts_its_prefix_cache():
    chat = {
        "model": "vl",
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "What is in it?"}, image_part(png(448, 448))],
            }
        ],
    }
    with sim_engine(
        "--profile", "h100-qwen2-vl-7b-vision", "--time-scale", "50", "--served-model-name", "vl",
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
    ) as sim:  # fmt: skip
        answers = [json.loads(http("POST", sim.url + "/v1/chat/completions", chat)[2]) for _ in range(2)]
        usages = [a["usage"] for a in answers]
        assert [u["prompt_tokens"] for u in usages] == [264, 264]  # 8 text + 256 image tokens
        assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 256]
        assert usages[0]["prompt_tokens_details"]["multimodal_tokens"] == {"image": 256}
        metrics = http("GET", sim.url + "/metrics")[2].decode()
        assert _metric(metrics, "vllm:prefix_cache_queries_total") == 528
        assert _metric(metrics, "vllm:prefix_cache_hits_total") == 256
        remote = {
            **chat,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
            ],
        }
        status, _, body = http("POST", sim.url + "/v1/chat/completions", remote)
        assert status == 400 and b"does not fetch" in body
        # a part with no type but an image URL string is an image to vLLM (and to the router's price)
        bare = {"image_url": data_url(png(448, 448))}
        typeless = {
            **chat,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in it?"}, bare]}],
        }
        usage = json.loads(http("POST", sim.url + "/v1/chat/completions", typeless)[2])["usage"]
        assert usage["prompt_tokens"] == 264 and usage["prompt_tokens_details"]["multimodal_tokens"] == {
            "image": 256
        }
    with sim_engine("--profile", "tiny-test", "--time-scale", "50", "--served-model-name", "vl") as text_only:
        status, _, body = http("POST", text_only.url + "/v1/chat/completions", chat)
        assert status == 400 and b"not a multimodal model" in body  # as vLLM says for a text model
        plain = {"model": "vl", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        usage = json.loads(http("POST", text_only.url + "/v1/chat/completions", plain)[2])["usage"]
        assert usage["prompt_tokens_details"] is None  # without --enable-prompt-tokens-details, as vLLM
