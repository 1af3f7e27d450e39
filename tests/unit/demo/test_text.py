import math

from llmswap.demo.text import answer_tokens, count_tokens, embedding, relevance_scores, text_of


def test_answer_names_the_model_and_has_exactly_the_requested_tokens() -> None:
    tokens = answer_tokens("qwen-7b", "hello", 6)
    assert len(tokens) == 6
    assert "".join(tokens).startswith("demo qwen-7b says: 1-")
    assert all(token.startswith(" ") for token in tokens[1:])


def test_answer_is_deterministic_and_depends_on_model_and_prompt() -> None:
    assert answer_tokens("a", "hello", 12) == answer_tokens("a", "hello", 12)
    assert answer_tokens("a", "hello", 12) != answer_tokens("a", "goodbye", 12)
    assert answer_tokens("a", "hello", 12)[3:] != answer_tokens("b", "hello", 12)[3:]


def test_answer_is_a_prefix_of_a_longer_answer_to_the_same_prompt() -> None:
    assert answer_tokens("m", "p", 20)[:7] == answer_tokens("m", "p", 7)


def test_answer_with_zero_tokens_is_empty() -> None:
    assert answer_tokens("m", "p", 0) == []


def test_count_tokens_counts_words() -> None:
    assert count_tokens("Hello, world! 42") == 3
    assert count_tokens("") == 0


def test_text_of_collects_text_from_every_prompt_shape() -> None:
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert text_of(chat) == "be brief\nlook"
    assert text_of("plain") == "plain"
    assert text_of([{"type": "input_text", "text": "responses item"}]) == "responses item"
    assert text_of(None) == ""
    assert text_of(42) == ""


def test_embedding_is_unit_length_deterministic_and_sized() -> None:
    vector = embedding("m", "text", 8)
    assert len(vector) == 8
    assert math.isclose(math.fsum(x * x for x in vector), 1.0)
    assert embedding("m", "text", 8) == vector
    assert embedding("m", "other", 8) != vector
    assert embedding("n", "text", 8) != vector
    assert len(embedding("m", "text", 100)) == 100


def test_relevance_prefers_documents_sharing_query_words() -> None:
    scores = relevance_scores("m", "red fox", ["blue whale", "a red car", "the red fox"])
    assert scores[2] > scores[1] > scores[0]
    assert all(0 <= score < 1 for score in scores)
    assert relevance_scores("m", "red fox", ["blue whale", "a red car", "the red fox"]) == scores
