"""The matrix set language's syntax: the expression tree, the tokenizer and the parser.

A set is an expression: `a & b` (both), `a | b` (either), parentheses, `+other` (inline another set),
where an identifier is a var (`vars:`) or a real model id; `&` binds tighter than `|`. `parse_set`
turns one set's text into a small tree; `matrix_dsl` links and solves the trees.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

VAR_KEY = re.compile(r"[a-zA-Z0-9.-]{1,32}")
DEFAULT_EVICT_COST = 1


class MatrixError(ValueError):
    """A matrix configuration error; `path` locates the offending key under `matrix:`."""

    def __init__(self, message: str, path: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


# --- AST -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Leaf:
    """A model: the identifier as written until compiled, the real model id afterwards."""

    name: str
    column: int = 0


@dataclass(frozen=True, eq=False)
class Ref:
    """`+name`: another set's expression, inlined. Replaced by that set's tree when compiled."""

    name: str
    column: int = 0


@dataclass(frozen=True, eq=False)
class AllOf:
    """`a & b & ...`: one choice from every child, together."""

    children: tuple[Node, ...]


@dataclass(frozen=True, eq=False)
class AnyOf:
    """`a | b | ...`: the choices of any one child."""

    children: tuple[Node, ...]


Node = Leaf | Ref | AllOf | AnyOf


# --- tokens and parser ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "ident", "ref", "&", "|", "(", ")", "end"
    text: str
    column: int  # 1-based, in the expression as written

    @property
    def shown(self) -> str:
        return "+" + self.text if self.kind == "ref" else self.text


def _is_ident_char(ch: str) -> bool:
    return ch.isalpha() or unicodedata.category(ch) == "Nd" or ch in "_-."


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "&|()":
            tokens.append(_Token(ch, ch, i + 1))
            i += 1
        elif ch == "+":
            start = i + 1
            end = start
            while end < len(text) and _is_ident_char(text[end]):
                end += 1
            if end == start:
                raise _SyntaxError(f"expected set name after '+' at column {start + 1}")
            tokens.append(_Token("ref", text[start:end], i + 1))
            i = end
        elif _is_ident_char(ch):
            end = i
            while end < len(text) and _is_ident_char(text[end]):
                end += 1
            tokens.append(_Token("ident", text[i:end], i + 1))
            i = end
        else:
            raise _SyntaxError(f"unexpected character {ch!r} at column {i + 1}")
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


class _SyntaxError(Exception):
    """Raised inside the parser; turned into a `MatrixError` naming the set."""


class _Parser:
    """Recursive descent over `or := and ('|' and)*; and := atom ('&' atom)*; atom := IDENT | +REF | (or)`."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._pos = 0

    def _peek(self) -> _Token:
        return self._tokens[self._pos]

    def _next(self) -> _Token:
        token = self._tokens[self._pos]
        if token.kind != "end":
            self._pos += 1
        return token

    def parse(self) -> Node:
        root = self._any_of()
        token = self._peek()
        if token.kind != "end":
            raise _SyntaxError(f'unexpected token "{token.shown}" after expression at column {token.column}')
        return root

    def _any_of(self) -> Node:
        children = [self._all_of()]
        while self._peek().kind == "|":
            self._next()
            children.append(self._all_of())
        return children[0] if len(children) == 1 else AnyOf(tuple(children))

    def _all_of(self) -> Node:
        children = [self._atom()]
        while self._peek().kind == "&":
            self._next()
            children.append(self._atom())
        return children[0] if len(children) == 1 else AllOf(tuple(children))

    def _atom(self) -> Node:
        token = self._next()
        if token.kind == "ident":
            return Leaf(token.text, token.column)
        if token.kind == "ref":
            return Ref(token.text, token.column)
        if token.kind == "(":
            inner = self._any_of()
            closing = self._next()
            if closing.kind != ")":
                raise _SyntaxError(f"missing closing parenthesis at column {closing.column}")
            return inner
        if token.kind == "end":
            raise _SyntaxError(f"unexpected end of expression at column {token.column}")
        raise _SyntaxError(f'unexpected token "{token.shown}" at column {token.column}')


def parse_set(name: str, text: str) -> Node:
    """Parse one set's expression; identifiers are left unresolved."""
    if not text.strip():
        raise MatrixError(f'set "{name}": empty DSL expression', ("sets", name))
    try:
        return _Parser(_tokenize(text)).parse()
    except _SyntaxError as exc:
        raise MatrixError(f'set "{name}": {exc}', ("sets", name)) from None


def walk(node: Node) -> list[Node]:
    """Pre-order, left to right: the order errors are reported in."""
    out: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        if isinstance(current, AllOf | AnyOf):
            stack.extend(reversed(current.children))
    return out
