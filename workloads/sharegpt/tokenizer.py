"""Token counting for workload derivation: exact (a local HF tokenizer) or a
download-free default.

A workload needs token ids, not just counts: the simulator matches prefixes on
ids, so shared contexts must have identical leading ids and private ones must
not. Every tokenizer here returns ids *and* the character offset where each
token ends, so a context can be cut to exactly L tokens and its text cut at
the same place.

The default `RegexTokenizer` needs nothing downloaded. It approximates a
byte-level BPE: the GPT-2 pre-tokenizer pattern splits text into pieces
(a word with its leading space, a digit run, a punctuation run, whitespace),
pieces longer than 4 characters are split into 4-character chunks, and each
chunk's id is ``crc32(chunk) mod 2**17``. crc32 (not Python's salted
``hash()``) makes ids identical across processes and machines. Its counts
are an approximation of a real tokenizer; pass ``--tokenizer`` for exact ones.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np

from common.errors import HbenchError

DEFAULT_TOKENIZER = "regex-bpe-approx-v1"
VOCAB_SIZE = 1 << 17
MAX_PIECE_CHARS = 4

# GPT-2's pattern with Python-re classes ([^\W\d_] is a Unicode letter, \d a
# digit, and the punctuation class also takes "_", a \w that is neither),
# with every run bounded at 4 characters. Matching this is the same as matching
# GPT-2's pieces and cutting each into 4-character chunks from its start, but
# one findall yields the tokens directly.
_L = r"[^\W\d_]"
_P = r"(?:[^\s\w]|_)"
_N, _N1 = MAX_PIECE_CHARS, MAX_PIECE_CHARS - 1
_TOKEN = re.compile(
    rf"'(?:[sdmt]|ll|ve|re)| {_L}{{1,{_N1}}}|{_L}{{1,{_N}}}| \d{{1,{_N1}}}|\d{{1,{_N}}}"
    rf"| {_P}{{1,{_N1}}}|{_P}{{1,{_N}}}|\s{{1,{_N}}}(?!\S)|\s{{1,{_N}}}"
)


class _HashedIds(dict):
    """chunk -> id, filled on first sight; ids are crc32 so any process agrees."""

    def __missing__(self, chunk: str) -> int:
        tid = zlib.crc32(chunk.encode("utf-8")) % VOCAB_SIZE
        self[chunk] = tid
        return tid


class Tokenizer(Protocol):
    """What derivation needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int64) and, per token, the end offset in ``text`` (int64).

        ``text[:ends[k - 1]]`` is the text of the first k tokens.
        """
        ...

    def count(self, text: str) -> int:
        """``len(encode(text)[0])``, without building the ids (a reply needs only its length)."""
        ...


class RegexTokenizer:
    """Deterministic regex pre-tokenizer with hashed ids (see module docstring)."""

    name = DEFAULT_TOKENIZER

    def __init__(self):
        # Chunks are at most 4 characters, so this memo stays bounded.
        self._ids = _HashedIds()

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        chunks = _TOKEN.findall(text)
        n = len(chunks)
        ids = np.fromiter(map(self._ids.__getitem__, chunks), dtype=np.int64, count=n)
        ends = np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=n))
        return ids, ends

    def count(self, text: str) -> int:
        return len(_TOKEN.findall(text))


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` (exact counts for that model)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise HbenchError(f"no tokenizer.json at {path}")
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise HbenchError(
                "--tokenizer needs the 'tokenizers' package (pip install tokenizers)"
            ) from None
        try:
            self._tok = _Tok.from_file(str(file))
        except Exception as exc:  # the Rust side raises a plain Exception
            raise HbenchError(f"cannot read tokenizer {file}: {str(exc).splitlines()[0]}") from None
        self.name = f"hf:{file.resolve()}"

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        enc = self._tok.encode(text, add_special_tokens=False)
        ids = np.asarray(enc.ids, dtype=np.int64)
        ends = np.asarray([e for _, e in enc.offsets], dtype=np.int64)
        # Byte-level tokens inside one character share offsets; keep ends monotone.
        return ids, np.maximum.accumulate(ends) if len(ends) else ends

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


_DEFAULT = RegexTokenizer()


def get_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """The default tokenizer (shared memo) or an HF tokenizer at ``path``."""
    if path is None:
        return _DEFAULT
    return HFTokenizer(path)
