"""Cached and image prompt tokens read from an engine's usage bytes (vLLM's
prompt_tokens_details), and a request metered with them: worked numbers."""

from __future__ import annotations

import json

import pytest

from dataplane.router.pricing import CostModel, metered
from dataplane.router.proxy import UsageScan
from dataplane.router.usage_details import NO_DETAILS, prompt_details

C = CostModel(0.002, 0.02, 0.1, cached_token_factor=0.1, delta=0.0001)
VLLM_USAGE = (
    b'{"id":"x","choices":[],"usage":{"prompt_tokens":1300,"total_tokens":1316,"completion_tokens":16,'
    b'"prompt_tokens_details":{"cached_tokens":1024,"created_cache_tokens":null,'
    b'"multimodal_tokens":{"image":256}}}}'
)


def test_the_details_are_read_from_vllms_usage():
    assert prompt_details(VLLM_USAGE) == (1024, 256)
    spaced = json.dumps(json.loads(VLLM_USAGE)).encode()  # the sim's json.dumps spelling
    assert prompt_details(spaced) == (1024, 256)


@pytest.mark.parametrize(
    "usage",
    [
        b'"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}',
        b'"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":null}',
        b'"content":"\\"prompt_tokens_details\\":{\\"cached_tokens\\":99}","usage":{"prompt_tokens":5}',
    ],
)
def test_no_details_read_as_none_cached_and_no_image_tokens(usage):
    assert prompt_details(usage) == NO_DETAILS  # a generated text's escaped keys never match


def test_a_request_is_metered_with_its_cached_and_image_tokens():
    # usage 1,300 in (1,024 cached, 256 of the image) / 16 out:
    # 0.002 x (276 + 0.1 x 1,024) + 0.02 x 16 + 0.1 + 0.0001 x 256 = 1.2024 MU
    mu, tin, tout = metered(C, (20, 256), (1300, 16), 0, 200, details=(1024, 256))
    assert (mu, tin, tout) == (pytest.approx(1.2024), 1300, 16)
    # the engine did not say the image's tokens: the router's count prices them
    assert metered(C, (20, 256), (1300, 16), 0, 200, details=(1024, 0), image_tokens=256)[0] == pytest.approx(
        1.2024
    )
    # no details at all: nothing cached -> 0.002 x 1,300 + 0.32 + 0.1 + 0.0256 = 3.0456 MU
    assert metered(C, (20, 256), (1300, 16), 0, 200, image_tokens=256)[0] == pytest.approx(3.0456)
    # cut before its usage, 5 tokens delivered: the estimate's input (its image tokens in it)
    # 0.002 x 276 + 0.02 x 5 + 0.1 + 0.0256 = 0.7776 MU
    assert metered(C, (276, 256), None, 5, 200, image_tokens=256)[0] == pytest.approx(0.7776)


def test_a_passed_through_answer_keeps_its_details():
    scan = UsageScan()
    half = len(VLLM_USAGE) // 2
    scan.feed(VLLM_USAGE[:half])
    scan.feed(VLLM_USAGE[half:])
    assert (scan.end(), scan.details) == ((1300, 16), (1024, 256))
