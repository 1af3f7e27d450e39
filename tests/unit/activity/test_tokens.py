"""Token counts and speeds read from upstream answers (pure)."""

import json

import pytest

from llmswap.activity.tokens import (
    MAX_LINE,
    Reported,
    SseScanner,
    cached_of,
    read_json_answer,
    token_stats,
)


def sse(*events: object) -> bytes:
    lines = [f"data: {json.dumps(event) if not isinstance(event, str) else event}\n\n" for event in events]
    return "".join(lines).encode()


def scan(data: bytes, chunk: int = 7) -> Reported:
    scanner = SseScanner()
    for start in range(0, len(data), chunk):
        scanner.feed(data[start : start + chunk])
    return scanner.finish()


def test_openai_usage_gives_counts_and_unknown_speeds():
    body = json.dumps({"usage": {"prompt_tokens": 12, "completion_tokens": 7,
                                 "prompt_tokens_details": {"cached_tokens": 4}}}).encode()
    stats, duration = token_stats(read_json_answer(body), 33)
    assert (stats.input_tokens, stats.output_tokens, stats.cache_tokens) == (12, 7, 4)
    assert (stats.prompt_per_second, stats.tokens_per_second) == (-1, -1)
    assert (stats.draft_tokens, stats.draft_acc_tokens) == (-1, -1)
    assert duration == 33


def test_anthropic_usage_reads_input_output_and_cache_read():
    usage = {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 2}
    body = json.dumps({"usage": usage}).encode()
    stats, _ = token_stats(read_json_answer(body), 1)
    assert (stats.input_tokens, stats.output_tokens, stats.cache_tokens) == (5, 9, 2)


def test_llamacpp_timings_replace_usage_and_give_speeds_and_duration():
    answer = {
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "timings": {"prompt_n": 40, "prompt_ms": 200, "prompt_per_second": 200.0, "predicted_n": 25,
                    "predicted_ms": 1250, "predicted_per_second": 20.0, "cache_n": 8,
                    "draft_n": 10, "draft_n_accepted": 6},
    }
    stats, duration = token_stats(read_json_answer(json.dumps(answer).encode()), 900)
    assert (stats.input_tokens, stats.output_tokens, stats.cache_tokens) == (40, 25, 8)
    assert (stats.prompt_per_second, stats.tokens_per_second) == (200.0, 20.0)
    assert (stats.draft_tokens, stats.draft_acc_tokens) == (10, 6)
    assert duration == 1450


def test_draft_counts_need_both_fields():
    answer = {"timings": {"prompt_n": 1, "predicted_n": 1, "draft_n": 10}}
    stats, _ = token_stats(read_json_answer(json.dumps(answer).encode()), 1)
    assert (stats.draft_tokens, stats.draft_acc_tokens) == (-1, -1)


def test_vllm_metrics_give_speeds_and_speculative_counts():
    answer = {"usage": {"prompt_tokens": 14, "completion_tokens": 3},
              "metrics": {"time_to_first_token_ms": 70, "mean_itl_ms": 10, "tokens_per_second": 999,
                          "speculative_decoding": {"num_draft_tokens": 12, "num_accepted_draft_tokens": 9}}}
    stats, _ = token_stats(read_json_answer(json.dumps(answer).encode()), 1)
    assert stats.prompt_per_second == pytest.approx(200.0)
    assert stats.tokens_per_second == pytest.approx(100.0)
    assert (stats.cache_tokens, stats.draft_tokens, stats.draft_acc_tokens) == (-1, 12, 9)


def test_vllm_prompt_speed_leaves_out_cached_tokens():
    answer = {"usage": {"prompt_tokens": 42, "prompt_tokens_details": {"cached_tokens": 20}},
              "metrics": {"time_to_first_token_ms": 85.2}}
    stats, _ = token_stats(read_json_answer(json.dumps(answer).encode()), 1)
    assert stats.prompt_per_second == pytest.approx(22 / 0.0852)


def test_answer_without_usage_is_a_minimal_row():
    stats, duration = token_stats(read_json_answer(b'{"data": []}'), 12)
    assert stats.as_dict() == {"cache_tokens": 0, "draft_tokens": 0, "draft_acc_tokens": 0, "input_tokens": 0,
                               "output_tokens": 0, "prompt_per_second": 0.0, "tokens_per_second": 0.0}
    assert duration == 12
    assert not read_json_answer(b"<html>").found


def test_infill_list_answer_reads_the_last_elements_timings():
    answer = [{"timings": {"prompt_n": 1}}, {"timings": {"prompt_n": 3, "predicted_n": 4}}]
    stats, _ = token_stats(read_json_answer(json.dumps(answer).encode(), "/infill"), 1)
    assert (stats.input_tokens, stats.output_tokens) == (3, 4)


def test_openai_stream_usage_in_the_last_chunk_split_anywhere():
    data = sse({"choices": [{"delta": {"content": "hi"}}], "usage": None},
               {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 2}}, "[DONE]")
    for size in (1, 3, 7, 64, len(data)):
        stats, _ = token_stats(scan(data, size), 1)
        assert (stats.input_tokens, stats.output_tokens) == (8, 2)


def test_anthropic_stream_keeps_input_from_message_start_and_output_from_message_delta():
    data = sse({"type": "message_start", "message": {"usage": {"input_tokens": 11, "output_tokens": 0}}},
               {"type": "content_block_delta", "delta": {"text": "x"}},
               {"type": "message_delta", "usage": {"output_tokens": 6}})
    stats, _ = token_stats(scan(data), 1)
    assert (stats.input_tokens, stats.output_tokens) == (11, 6)


def test_responses_stream_reads_response_usage():
    data = sse({"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 5}}})
    stats, _ = token_stats(scan(data), 1)
    assert (stats.input_tokens, stats.output_tokens) == (4, 5)


def test_llamacpp_stream_keeps_the_last_timings():
    data = sse({"timings": {"prompt_n": 1, "predicted_n": 1, "predicted_per_second": 1.0}},
               {"timings": {"prompt_n": 9, "predicted_n": 30, "predicted_per_second": 42.5,
                            "prompt_per_second": 900.0}})
    stats, _ = token_stats(scan(data, 5), 1)
    assert (stats.input_tokens, stats.output_tokens, stats.tokens_per_second) == (9, 30, 42.5)


def test_stream_without_trailing_newline_still_counts():
    stats, _ = token_stats(scan(b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 3}}'), 1)
    assert (stats.input_tokens, stats.output_tokens) == (2, 3)


def test_overlong_line_is_skipped_without_being_held():
    scanner = SseScanner()
    scanner.feed(b'data: {"usage": {"prompt_tokens": 1, ' + b"x" * (MAX_LINE + 10))
    assert len(scanner._partial) == 0
    scanner.feed(b'more"}\n\ndata: {"usage": {"prompt_tokens": 5, "completion_tokens": 1}}\n\n')
    stats, _ = token_stats(scanner.finish(), 1)
    assert (stats.input_tokens, stats.output_tokens) == (5, 1)


def test_loading_state_and_non_json_lines_are_ignored():
    loading = sse({"choices": [{"delta": {"reasoning_content": "loading"}}]})
    data = b": keep-alive\n\ndata: not json usage\"\n\n" + loading
    assert not scan(data).found


def test_usage_is_found_by_its_key_and_not_inside_generated_text():
    content = 'the key "usage": {"prompt_tokens": 999} and ünïcödé text'
    answer = {"choices": [{"message": {"content": content}}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    stats, _ = token_stats(read_json_answer(json.dumps(answer, ensure_ascii=False).encode()), 1)
    assert (stats.input_tokens, stats.output_tokens) == (7, 3)
    only_text = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
    assert not read_json_answer(only_text).found


def test_a_broken_usage_object_is_skipped():
    assert not read_json_answer(b'{"usage": {"prompt_tokens": 1,').found


def test_usage_is_found_wherever_the_answer_puts_it_and_the_last_one_counts():
    first = {"usage": {"prompt_tokens": 5, "completion_tokens": 2}, "choices": [{"text": "word " * 1000}]}
    stats, _ = token_stats(read_json_answer(json.dumps(first).encode()), 1)
    assert (stats.input_tokens, stats.output_tokens) == (5, 2)
    nested_then_top = (b'{"choices": [{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}], '
                       b'"usage": {"prompt_tokens": 8, "completion_tokens": 4}}')
    stats, _ = token_stats(read_json_answer(nested_then_top), 1)
    assert (stats.input_tokens, stats.output_tokens) == (8, 4)


def test_cached_of_prefers_llama_cpp_timings_then_usage_and_says_none_when_unsaid():
    assert cached_of(read_json_answer(b'{"usage": {"prompt_tokens": 9, "prompt_tokens_details": '
                                      b'{"cached_tokens": 7}}, "timings": {"cache_n": 8}}')) == 8
    assert cached_of(read_json_answer(b'{"usage": {"prompt_tokens": 9, "prompt_tokens_details": '
                                      b'{"cached_tokens": 7}}}')) == 7
    assert cached_of(read_json_answer(b'{"usage": {"prompt_tokens": 9}}')) is None
