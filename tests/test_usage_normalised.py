"""Each protocol's ``normalised_usage``: a reply's usage, made by the provider's official SDK types
(their field names, not ours), as the OpenTelemetry GenAI counts (every input token, cached ones
included, in ``input_tokens``)."""

from __future__ import annotations

from anthropic.types import Usage as AnthropicUsage
from google.genai import types as genai
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import ResponseUsage

from pvisor.adapters.protocols import PROTOCOL_MODULES, get_protocol
from pvisor.adapters.protocols.base import TokenUsage


def test_anthropic_input_is_the_sum_of_uncached_cache_reads_and_cache_writes():
    usage = AnthropicUsage(
        input_tokens=3, output_tokens=50, cache_read_input_tokens=1200, cache_creation_input_tokens=40
    ).model_dump()
    assert get_protocol("anthropic").normalised_usage(usage) == TokenUsage(
        input_tokens=1243, cached_input_tokens=1200, cache_creation_input_tokens=40, output_tokens=50
    )
    # a reply without cache fields: the input is input_tokens alone, the cache counts unknown
    bare = get_protocol("anthropic").normalised_usage({"input_tokens": 7, "output_tokens": 2})
    assert bare.as_dict() == {
        "input_tokens": 7,
        "cached_input_tokens": None,
        "cache_creation_input_tokens": None,
        "output_tokens": 2,
        "reasoning_tokens": None,
    }


def test_openai_chat_and_responses_already_count_cached_tokens_in_their_input():
    chat = CompletionUsage(
        prompt_tokens=900,
        completion_tokens=60,
        total_tokens=960,
        prompt_tokens_details={"cached_tokens": 512},
        completion_tokens_details={"reasoning_tokens": 20},
    ).model_dump()
    assert get_protocol("openai-chat").normalised_usage(chat) == TokenUsage(
        input_tokens=900, cached_input_tokens=512, output_tokens=60, reasoning_tokens=20
    )
    responses = ResponseUsage(
        input_tokens=900,
        output_tokens=60,
        total_tokens=960,
        input_tokens_details={"cached_tokens": 512, "cache_write_tokens": 100},
        output_tokens_details={"reasoning_tokens": 20},
    ).model_dump()
    assert get_protocol("openai-responses").normalised_usage(responses) == TokenUsage(
        input_tokens=900,
        cached_input_tokens=512,
        cache_creation_input_tokens=100,
        output_tokens=60,
        reasoning_tokens=20,
    )


def test_gemini_output_adds_the_thoughts_its_candidates_count_leaves_out():
    meta = genai.GenerateContentResponseUsageMetadata(
        prompt_token_count=800,
        cached_content_token_count=300,
        candidates_token_count=40,
        thoughts_token_count=25,
    ).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert get_protocol("gemini").normalised_usage(meta) == TokenUsage(
        input_tokens=800, cached_input_tokens=300, output_tokens=65, reasoning_tokens=25
    )


def test_no_usage_is_all_unknown_for_every_protocol():
    for name in PROTOCOL_MODULES:
        for usage in (None, {}, "x", {"input_tokens": True}):
            got = get_protocol(name).normalised_usage(usage)
            assert got.input_tokens is None and got.output_tokens is None, (name, usage)
