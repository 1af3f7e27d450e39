"""The GGUF generator: files that read back as the llama model they describe, cached by spec. That llama.cpp
loads them and only ever samples visible text is tests/e2e/llamaserver/test_gguf_llamaserver.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGUFReader, TokenType

from tests.helpers.gguf_model import ANCHOR, BOS, EOS, NEVER, SIZES, UNK, TinyLlama, tiny_llama, vocabulary

SMALLEST = TinyLlama("unit", embedding=32, layers=1, feed_forward=64, heads=2, kv_heads=1, seed=5)


def test_vocabulary_covers_every_byte_once() -> None:
    vocab = vocabulary()
    assert len(set(vocab.tokens)) == len(vocab.tokens)
    assert len(vocab.tokens) == len(vocab.scores) == len(vocab.types)
    kinds = zip(vocab.tokens, vocab.types, strict=True)
    byte_tokens = [token for token, kind in kinds if kind == TokenType.BYTE]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]
    # SentencePiece reaches a word only through pieces that are themselves tokens
    for token in vocab.tokens:
        if token.startswith("\u2581") and len(token) > 1:
            assert token[:-1] in vocab.tokens


def test_never_sampled_tokens_are_the_specials_and_bytes_that_are_not_printable_ascii() -> None:
    vocab = vocabulary()
    never = set(vocab.never_sampled)
    assert {UNK, BOS, EOS} <= never
    for index in never - {UNK, BOS, EOS}:
        byte = int(vocab.tokens[index][3:5], 16)
        assert not 0x20 <= byte < 0x7F
    assert len(never) == 3 + 256 - (0x7F - 0x20)


def test_written_model_reads_back_with_its_llama_shape(tmp_path: Path) -> None:
    path = tiny_llama(SMALLEST, tmp_path)
    reader = GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.block_count"].contents() == SMALLEST.layers
    assert reader.fields["llama.embedding_length"].contents() == SMALLEST.embedding
    assert reader.fields["llama.attention.head_count_kv"].contents() == SMALLEST.kv_heads
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    n_vocab = len(vocabulary().tokens)
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == n_vocab
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    assert len(tensors) == 2 + 9 * SMALLEST.layers + 1
    head_dim = SMALLEST.embedding // SMALLEST.heads
    assert tensors["blk.0.attn_k.weight"].data.shape == (head_dim * SMALLEST.kv_heads, SMALLEST.embedding)
    assert tensors["blk.0.ffn_down.weight"].data.shape == (SMALLEST.embedding, SMALLEST.feed_forward)
    assert tensors["output.weight"].data.shape == (n_vocab, SMALLEST.embedding)


def test_residual_dimension_zero_holds_the_anchor_that_rules_out_never_sampled_tokens(tmp_path: Path) -> None:
    reader = GGUFReader(tiny_llama(SMALLEST, tmp_path))
    tensors = {tensor.name: np.asarray(tensor.data) for tensor in reader.tensors}
    assert np.all(tensors["token_embd.weight"][:, 0] == ANCHOR)
    assert not tensors["blk.0.attn_output.weight"][0].any()
    assert not tensors["blk.0.ffn_down.weight"][0].any()
    output = tensors["output.weight"]
    never = list(vocabulary().never_sampled)
    assert np.all(output[never, 0] == NEVER)
    assert not output[never, 1:].any()
    assert not output[:, 0][np.setdiff1d(np.arange(len(output)), never)].any()


def test_files_are_cached_per_spec_and_differ_by_seed(tmp_path: Path) -> None:
    first = tiny_llama(SMALLEST, tmp_path)
    written = first.stat().st_mtime_ns
    assert tiny_llama(SMALLEST, tmp_path) == first
    assert first.stat().st_mtime_ns == written
    reseeded = tiny_llama(replace(SMALLEST, seed=6), tmp_path)
    assert reseeded != first
    assert reseeded.read_bytes() != first.read_bytes()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([first.name, reseeded.name])  # no partial files


def test_sizes_grow(tmp_path: Path) -> None:
    sizes = [tiny_llama(spec, tmp_path).stat().st_size for spec in SIZES.values()]
    assert sizes == sorted(sizes)
    assert sizes[-1] > 10 * sizes[0]
