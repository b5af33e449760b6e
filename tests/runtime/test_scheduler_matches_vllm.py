"""The perf model's steps schedule what vLLM 0.32's own scheduler does: the same requests into
vLLM's V1 `Scheduler` (v1/core/sched/scheduler.py: no model runs, its output is a sampled token
wherever a request's prompt is done) and into `perf_model.step`, compared step by step as the
tokens each request is given. Chunked prefill within the token budget, admission by free slots,
and `--long-prefill-token-threshold` (a long prompt capped a step while others run or wait,
uncapped alone). The KV cache is ample: the perf model reserves a request's whole KV at
admission, vLLM block by block (the simplification its docstring states).

Run with ``scripts/test-vllm.sh`` (skipped where vllm is not installed)."""

from __future__ import annotations

import importlib.util
import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from engine_model import perf_model as pm
from engine_model.profiles import TINY_TEST
from tests.runtime.support import TinyModel

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed here"),
]

CONTEXT = 512  # the tiny Llama's max_position_embeddings
BLOCKS = 4096  # 16 tokens each: 64k tokens, far beyond any case's


def vllm_scheduler(model: Path, budget: int, seqs: int, threshold: int) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        max_model_len=CONTEXT,
        long_prefill_token_threshold=threshold,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    config = VllmConfig(
        scheduler_config=scheduler,
        model_config=ModelConfig(model=str(model), dtype="float32", seed=0, max_model_len=CONTEXT),
        cache_config=cache,
    )
    cache.num_gpu_blocks = BLOCKS
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
    )


def vllm_steps(
    model: Path, budget: int, seqs: int, threshold: int, shapes: list[tuple[int, int]]
) -> list[dict]:
    """Each step's tokens per request id in vLLM's scheduler, every request waiting at the start."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    s = vllm_scheduler(model, budget, seqs, threshold)
    for i, (prompt, output) in enumerate(shapes):
        s.add_request(
            Request(str(i), [2 + i] * prompt, SamplingParams(max_tokens=output, ignore_eos=True), None)
        )
    steps: list[dict] = []
    while len(steps) < 1000:
        out = s.schedule()
        if not out.num_scheduled_tokens:
            return steps
        steps.append(dict(out.num_scheduled_tokens))
        ids = list(out.num_scheduled_tokens)
        # A token is sampled where the prompt is done (schedule() has counted this step's tokens).
        sampled = [
            [5] if s.requests[r].num_computed_tokens >= s.requests[r].num_prompt_tokens else [] for r in ids
        ]
        s.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled
            ),
        )
    raise AssertionError("vLLM's scheduler did not finish in 1,000 steps")


def model_steps(budget: int, seqs: int, threshold: int, shapes: list[tuple[int, int]]) -> list[dict]:
    """The same in the perf model: a request's tokens a step are its prompt chunk, or 1 decoding."""
    profile = pm.EngineProfile(
        **{
            **TINY_TEST.__dict__,
            "max_batched_tokens": budget,
            "max_num_seqs": seqs,
            "max_model_len": CONTEXT,
            "kv_capacity_tokens": 16 * BLOCKS,
            "long_prefill_token_threshold": threshold,
        }
    )
    state = pm.EngineState()
    requests = [pm.SimRequest(str(i), prompt, output) for i, (prompt, output) in enumerate(shapes)]
    for r in requests:
        pm.submit(state, r)
    steps: list[dict] = []
    while pm.has_work(state):
        before = {r.request_id: (r.prefilled, r.generated) for r in requests}
        pm.step(profile, state)
        step = {}
        for r in requests:
            prefilled, generated = before[r.request_id]
            if r.prefilled > prefilled:
                step[r.request_id] = r.prefilled - prefilled
            elif r.generated > generated:
                step[r.request_id] = 1
        steps.append(step)
    return steps


def cases() -> list[tuple[str, int, int, int, list[tuple[int, int]]]]:
    """(name, budget, slots, threshold, shapes): worked ones, then mixes drawn from seeds."""
    out = [
        ("long then short", 256, 4, 0, [(450, 2), (100, 2)]),
        ("long then short, capped", 256, 4, 64, [(450, 2), (100, 2)]),
        ("more requests than slots", 128, 2, 0, [(200, 3), (60, 4), (300, 2), (20, 5)]),
    ]
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        shapes = [(rng.choice((8, 40, 150, 400)), rng.randint(1, 6)) for _ in range(8)]
        for threshold in (0, 32, 100):
            out.append((f"seed {seed}, threshold {threshold}", 256, 4, threshold, shapes))
    return out


@pytest.mark.parametrize(
    ("name", "budget", "seqs", "threshold", "shapes"), cases(), ids=[c[0] for c in cases()]
)
def test_each_step_gives_each_request_the_tokens_vllm_s_scheduler_gives(
    tiny_model: TinyModel, name: str, budget: int, seqs: int, threshold: int, shapes: list[tuple[int, int]]
) -> None:
    with warnings.catch_warnings():  # torch's and vLLM's own warnings as they load and configure
        warnings.simplefilter("ignore")
        theirs = vllm_steps(tiny_model.path, budget, seqs, threshold, shapes)
    ours = model_steps(budget, seqs, threshold, shapes)
    assert ours == theirs
