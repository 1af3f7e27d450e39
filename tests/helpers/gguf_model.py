"""Tiny llama-architecture GGUF models with random weights, generated here so no weights are ever downloaded.

``write_tiny_llama(spec, path)`` writes one model; ``tiny_llama(spec, folder)`` returns the file for `spec`
in `folder`, writing it only the first time (tests cache the folder for their session). ``SIZES`` holds three
specs whose files differ in size by about an order of magnitude each, so their load times differ too.
tests/helpers/llama_server.py has the command that serves one with llama.cpp's llama-server.

The tokenizer is SentencePiece-style (`tokenizer.ggml.model = llama`) with all 256 byte tokens, so llama.cpp
tokenizes any text (byte fallback) and no piece of text is out of vocabulary. The weights are seeded normal
noise: the models answer gibberish, deterministically for a seed and a sampling seed.

One thing is not noise: the unknown/BOS/EOS tokens and the byte tokens that are not printable ASCII can never
be sampled. Residual dimension 0 carries a constant that no layer writes to (row 0 of every output projection
is zero), and the output rows of those tokens are a large negative weight on that dimension alone, so their
logits are always hugely negative. A generation therefore always runs to `max_tokens` (finish_reason
"length", a known number of chunks) and every generated token decodes to visible ASCII text.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGUFWriter, LlamaFileType, PoolingType, TokenType

SPACE = "\u2581"  # SentencePiece's word-start marker: llama.cpp turns spaces into it before tokenizing
UNK, BOS, EOS = 0, 1, 2
ANCHOR = 4.0  # the constant in residual dimension 0
NEVER = -1000.0  # weight of a never-sampled token's logit on that dimension

WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with", "as", "at", "be",
    "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "when",
    "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each", "about", "how",
    "up", "out", "them", "then", "she", "many", "some", "so", "these", "would", "other", "into", "has",
    "more", "her", "two", "like", "him", "see", "time", "could", "no", "make", "than", "first", "been",
    "its", "who", "now", "people", "my", "made", "over", "did", "down", "only", "way", "find", "use", "may",
    "water", "long", "little", "very", "after", "words", "called", "just", "where", "most", "know", "model",
    "swap", "llama", "token", "hello", "world", "say", "something", "answer", "question", "text",
)


@dataclass(frozen=True)
class TinyLlama:
    """The shape of one generated model. `name` is also its `general.name`."""

    name: str
    embedding: int  # n_embd, also the length of its embedding vectors
    layers: int
    feed_forward: int
    heads: int
    kv_heads: int
    context: int = 512
    seed: int = 0
    dtype: Literal["f16", "f32"] = "f16"

    def fingerprint(self) -> str:
        """A short hash of the spec and the vocabulary: a changed spec or generator never reuses old files."""
        text = repr(sorted(asdict(self).items())) + repr(WORDS) + repr((ANCHOR, NEVER))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


SIZES: dict[str, TinyLlama] = {
    "tiny": TinyLlama("tiny", embedding=64, layers=2, feed_forward=192, heads=4, kv_heads=4, seed=1),
    "small": TinyLlama("small", embedding=256, layers=4, feed_forward=704, heads=4, kv_heads=2, seed=2),
    "medium": TinyLlama("medium", embedding=512, layers=8, feed_forward=1408, heads=8, kv_heads=4, seed=3),
}


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[TokenType, ...]
    never_sampled: tuple[int, ...]


def vocabulary() -> Vocabulary:
    """Special tokens, the 256 byte tokens, printable characters, and word pieces (every prefix of each word,
    since SentencePiece builds a word only through pieces that are themselves in the vocabulary)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    never = [UNK, BOS, EOS]
    for byte in range(256):
        if not 0x20 <= byte < 0x7F:
            never.append(len(tokens))
        tokens.append(f"<0x{byte:02X}>")
        types.append(TokenType.BYTE)
    pieces = [SPACE, *(chr(c) for c in range(0x21, 0x7F))]
    for word in WORDS:
        pieces.extend(SPACE + word[:end] for end in range(1, len(word) + 1))
    seen = set(tokens)
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(TokenType.NORMAL)
    # SentencePiece merges the pair whose merged piece scores highest: longer pieces win, so words form.
    scores = [float(len(token)) if kind == TokenType.NORMAL else 0.0
              for token, kind in zip(tokens, types, strict=True)]
    return Vocabulary(tuple(tokens), tuple(scores), tuple(types), tuple(never))


def write_tiny_llama(spec: TinyLlama, path: Path) -> Path:
    """Write the GGUF file for `spec` at `path` (atomically: a reader never sees half a file)."""
    if spec.embedding % spec.heads or spec.heads % spec.kv_heads:
        raise ValueError(f"{spec.name}: embedding ({spec.embedding}) must divide by heads ({spec.heads}), "
                         f"and heads by kv_heads ({spec.kv_heads})")
    vocab = vocabulary()
    rng = np.random.default_rng(spec.seed)
    matrix_type = np.dtype(np.float16 if spec.dtype == "f16" else np.float32)
    n_vocab, n_embd, head_dim = len(vocab.tokens), spec.embedding, spec.embedding // spec.heads
    n_kv = head_dim * spec.kv_heads

    def matrix(rows: int, columns: int) -> np.ndarray:
        # numpy's (rows, columns) is ggml's [columns, rows]: a layer maps `columns` inputs to `rows` outputs.
        weights = rng.standard_normal((rows, columns), dtype=np.float32) / np.float32(np.sqrt(columns))
        return weights.astype(matrix_type)

    def writes_residual(rows: int, columns: int) -> np.ndarray:
        weights = matrix(rows, columns)
        weights[0, :] = 0  # keeps residual dimension 0 at ANCHOR
        return weights

    ones = np.ones(n_embd, dtype=np.float32)  # norms stay f32: ggml expects 1-D tensors in f32
    embeddings = rng.standard_normal((n_vocab, n_embd), dtype=np.float32)
    embeddings[:, 0] = ANCHOR
    output = matrix(n_vocab, n_embd)
    output[:, 0] = 0
    output[list(vocab.never_sampled), :] = 0
    output[list(vocab.never_sampled), 0] = NEVER

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    writer = GGUFWriter(partial, "llama")
    writer.add_name(spec.name)
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else LlamaFileType.ALL_F32)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.feed_forward)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_pooling_type(PoolingType.MEAN)  # used only when a server enables embeddings
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", embeddings.astype(matrix_type))
    for layer in range(spec.layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", matrix(n_kv, n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", writes_residual(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones)
        writer.add_tensor(f"{prefix}.ffn_gate.weight", matrix(spec.feed_forward, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(spec.feed_forward, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", writes_residual(n_embd, spec.feed_forward))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", output)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    partial.replace(path)
    return path


def tiny_llama(spec: TinyLlama, folder: Path) -> Path:
    """The GGUF file for `spec` in `folder`, written on first use and reused after."""
    path = folder / f"{spec.name}-{spec.fingerprint()}.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(spec, path)
    return path


def words(count: int, seed: int) -> str:
    """`count` words of the vocabulary, picked by `seed`: a prompt of about `count` tokens."""
    picker = random.Random(seed)
    return " ".join(picker.choice(WORDS) for _ in range(count))
