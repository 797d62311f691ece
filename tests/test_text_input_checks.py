"""A user's text file: refused when it is not text, and a sentence cut to the token limit
is said, not silent (audit items 4 and 5).

- A file of NUL bytes is valid UTF-8: it was read as one sentence, its tokens dropped by the
  tokenizer, and "analysed" as [CLS] [SEP]. Control characters other than whitespace are now
  one line naming the file and the line; so is a file with no word at all.
- ``text_batch`` cuts every sentence to 48 tokens: a 5,000-word line became 48 tokens and
  nothing said so. The line that says what a command evaluates now says how many were cut,
  and ``--text``'s help states the limit.
"""

from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on the Hub

import pytest

from mhainterp import cli
from mhainterp.cli import pretrained_options
from mhainterp.tasks.text import TEXT_MAX_LEN, cut_sentences, read_sentences, text_sentences
from mhainterp.validation import ParameterError

transformers = pytest.importorskip("transformers")


# ----------------------------------------------------------------------------- not text


def test_a_file_of_nul_bytes_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "nul.bin"
    path.write_bytes(b"\0" * 1000)  # head -c 1000 /dev/zero
    for read in (read_sentences, text_sentences):
        with pytest.raises(ParameterError) as refused:
            read(path)
        message = str(refused.value)
        assert str(path) in message and "line 1 holds U+0000" in message
        assert "control characters" in message and "\n" not in message


def test_a_control_character_is_refused_at_its_line(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text("The cat sat on the mat.\nA dog ran.\r\nThe bell\x07 rang.\n")
    with pytest.raises(ParameterError, match="line 3 holds U\\+0007"):
        read_sentences(path)


def test_whitespace_controls_are_text(tmp_path):
    path = tmp_path / "fine.txt"
    path.write_text("The cat\tsat.\r\nA dog ran.\n\x0cThe bell rang.\n")  # tab, CRLF, form feed
    assert read_sentences(path) == ["The cat sat.", "A dog ran.", "The bell rang."]


def test_a_file_without_any_word_is_refused(tmp_path):
    path = tmp_path / "dots.txt"
    path.write_text("...\n-- ;\n!!\n")
    with pytest.raises(ParameterError) as refused:
        read_sentences(path)
    assert str(path) in str(refused.value) and "words" in str(refused.value)
    path.write_text("...\nThe end.\n")  # one sentence with a word is enough
    assert read_sentences(path) == ["...", "The end."]


def test_the_command_refuses_a_nul_file_in_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "nul.bin"
    path.write_bytes(b"\0" * 1000)
    monkeypatch.setattr(pretrained_options, "load_model", lambda name: _stand_in())
    out = tmp_path / "out"
    code = cli.main(["analyze", "--model", "minilm", "--text", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("mhainterp analyze: error: --text=") and "line 1" in err[0]
    assert not out.exists()


# ----------------------------------------------------------------------------- the 48-token cut


def _stand_in():
    """What the cut needs of a model: its tokenizer (BERT's word pieces over w0 .. w34)."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    (folder / "vocab.txt").write_text("\n".join(words))
    return SimpleNamespace(tokenizer=transformers.BertTokenizerFast(str(folder / "vocab.txt")))


LONG = " ".join(f"w{i % 30}" for i in range(5000)) + "."


def test_cut_sentences_counts_what_text_batch_cuts():
    model = _stand_in()
    assert cut_sentences(model, ["w1 w2.", "w3 w4 w5."]) == (0, 6)  # [CLS] w w . [SEP]
    assert cut_sentences(model, [LONG, "w1 w2.", LONG[:200]]) == (2, 5003)
    assert cut_sentences(model, [LONG], max_len=6000) == (0, 5003)


def test_the_announced_line_says_how_many_sentences_were_cut(tmp_path, monkeypatch, capsys):
    text = tmp_path / "long.txt"
    text.write_text(f"{LONG}\nThe cat sat.\nA dog ran.\n")
    monkeypatch.setattr(pretrained_options, "load_model", lambda name: _stand_in())
    args = argparse.Namespace(quiet=False, text=str(text))
    pretrained_options.load_and_announce(args, "minilm", 64, "")
    line = capsys.readouterr().err.strip()
    assert line == (
        f"minilm: 3 of 3 sentences of {text}; 1 of 3 cut to {TEXT_MAX_LEN} tokens (longest 5,003)"
    )
    assert pretrained_options.sentences_line("minilm", str(text), 2, model=_stand_in()) == (
        f"minilm: 2 of 3 sentences of {text}; 1 of 2 cut to 48 tokens (longest 5,003)"
    )
    # nothing cut: the line is as it was
    short = tmp_path / "short.txt"
    short.write_text("The cat sat.\nA dog ran.\n")
    assert pretrained_options.sentences_line("minilm", str(short), 64, model=_stand_in()) == (
        f"minilm: 2 of 2 sentences of {short}"
    )


def test_the_token_limit_is_one_number_and_text_help_states_it(capsys):
    assert pretrained_options.TEXT_MAX_LEN == TEXT_MAX_LEN == 48  # the parser imports no torch
    for command in ("analyze", "specialize", "explore"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert f"cut to {TEXT_MAX_LEN} tokens" in help_text, command


def test_explore_says_how_many_sentences_it_cuts(tmp_path, capsys):
    from mhainterp.cli.explore import _say_cut_sentences

    text = tmp_path / "long.txt"
    text.write_text(f"The cat sat.\n{LONG}\nA dog ran.\n")
    _say_cut_sentences(_stand_in(), str(text), 16)
    assert capsys.readouterr().err.strip() == (
        f"mhainterp explore: 1 of 3 sentences of {text} cut to 48 tokens (longest 5,003)"
    )
    _say_cut_sentences(_stand_in(), str(text), 1)  # the first sentence only: nothing cut
    assert capsys.readouterr().err == ""
