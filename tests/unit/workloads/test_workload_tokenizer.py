"""The default tokenizer is deterministic across processes and versions, cuts
pieces into <= 4-character chunks, and reports exact end offsets; the HF
tokenizer path fails with one-line errors when it cannot work."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import HbenchError
from tests.support import REPO_ROOT
from workloads.sharegpt.tokenizer import (
    DEFAULT_TOKENIZER,
    VOCAB_SIZE,
    HFTokenizer,
    RegexTokenizer,
    get_tokenizer,
)

TEXT = "Hello, world! It's   benchmarking_time 12345\n\nOk"


def _chunks(text):
    ids, ends = RegexTokenizer().encode(text)
    starts = np.concatenate([[0], ends[:-1]])
    return ids, [text[a:b] for a, b in zip(starts, ends, strict=True)]


def test_pieces_follow_gpt2_pattern_cut_into_four_char_chunks():
    _, chunks = _chunks(TEXT)
    assert chunks == ["Hell", "o", ",", " wor", "ld", "!", " It", "'s", "  ", " ben", "chma",
                      "rkin", "g", "_", "time", " 123", "45", "\n", "\n", "Ok"]


def test_ids_are_pinned_crc32_values():
    ids, _ = _chunks("Hello, world! It's")
    assert ids.tolist() == [45021, 103236, 33646, 27023, 37653, 131027, 122523, 32796]
    assert ids.dtype == np.int64 and ids.max() < VOCAB_SIZE


def test_ids_are_identical_in_a_fresh_process():
    code = ("from workloads.sharegpt.tokenizer import RegexTokenizer;"
            f"print(RegexTokenizer().encode({TEXT!r})[0].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""},
                         cwd=REPO_ROOT)
    assert out.stdout.strip() == str(RegexTokenizer().encode(TEXT)[0].tolist())


def test_ends_cover_the_text_so_a_prefix_of_k_tokens_is_a_text_prefix():
    text = "Ünïcode wörds, 中文字符测试 and ½ numbers ²; tabs\tand trailing   "
    ids, ends = RegexTokenizer().encode(text)
    assert ends[-1] == len(text) and np.all(np.diff(ends) > 0)
    k = 7
    assert np.array_equal(RegexTokenizer().encode(text[: ends[k - 1]])[0], ids[:k])


def test_default_tokenizer_is_shared_and_named():
    assert get_tokenizer() is get_tokenizer()
    assert get_tokenizer().name == DEFAULT_TOKENIZER


def test_missing_tokenizer_file_is_a_user_error(tmp_path):
    with pytest.raises(HbenchError, match="no tokenizer.json"):
        get_tokenizer(tmp_path / "nope")


def test_missing_tokenizers_package_is_a_user_error(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
    with pytest.raises(HbenchError, match="needs the 'tokenizers' package"):
        HFTokenizer(tmp_path)


def test_hf_tokenizer_counts_and_offsets(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([TEXT] * 20, trainers.BpeTrainer(vocab_size=300,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = get_tokenizer(tmp_path)
    ids, ends = hf.encode(TEXT)
    assert hf.name.startswith("hf:") and len(ids) == len(ends) > 0
    assert ids.tolist() == tok.encode(TEXT, add_special_tokens=False).ids
    assert ends[-1] == len(TEXT) and np.all(np.diff(ends) >= 0)


@pytest.mark.slow
@given(st.text(max_size=400))
def test_count_is_the_number_of_encoded_tokens(text):
    tok = RegexTokenizer()
    assert tok.count(text) == len(tok.encode(text)[0])
