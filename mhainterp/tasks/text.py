"""Real text for pretrained models: sentences -> the toolkit's ``Batch``, relations and axes.

- Sentences come from the standard library (``pydoc_data.topics``, the help texts of Python's
  ``help()``: a few hundred real English sentences after :func:`stdlib_sentences` filters out
  code, tables and fragments) or from a user's text file (:func:`read_sentences`).
- :func:`text_batch` tokenizes them with the model's tokenizer into the same
  :class:`~mhainterp.tasks.Batch` the synthetic tasks produce: next-token targets for causal
  models (position t is scored against token t+1), and for encoders (the embedding objective)
  every real position marked, with placeholder targets (0) that the embedding metric does
  not read.
- :func:`text_relations`: 0/1 ``[n, q, k]`` templates as in :mod:`mhainterp.tasks.templates`:
  ``previous``, ``next``, ``self``, ``first`` (BOS / [CLS]), ``last`` (the last real token:
  [SEP] or the final word), ``punctuation`` (keys that are punctuation), ``same_token``.
  These are the categories of Clark et al. (2019), so role scores and their nulls run unchanged.
- :func:`text_axes`: per ``[n, T]`` position, the values of the "whom a head serves" axes:
  ``token_class`` (punctuation / function word / content word / special), ``position``
  (bucket) and ``target_frequency`` (bucket of how common the next token is in the data).

Shapes: n sentences, T positions (q query, k key).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.tasks.base import Task
from mhainterp.tasks.batch import Batch
from mhainterp.tasks.templates import (
    check_tokens,
    finish_template,
    first_position_template,
    previous_token_template,
    query_key_positions,
    same_token_template,
    self_template,
)
from mhainterp.validation import check_int, invalid

if TYPE_CHECKING:  # annotations only: tasks do not depend on the model at run time
    from mhainterp.protocol import BridgedModel

__all__ = [
    "FUNCTION_WORDS",
    "POSITION_BUCKETS",
    "TEXT_AXES",
    "TEXT_MAX_LEN",
    "TEXT_N_EVAL",
    "TEXT_RELATIONS",
    "TOKEN_CLASSES",
    "TextTask",
    "TextRelations",
    "cut_sentences",
    "last_real_template",
    "next_token_batch",
    "next_token_template",
    "punctuation_ids",
    "punctuation_template",
    "read_sentences",
    "stdlib_sentences",
    "text_axes",
    "text_batch",
    "text_relations",
    "text_sentences",
]

TEXT_RELATIONS = ("previous", "next", "self", "first", "last", "punctuation", "same_token")
TOKEN_CLASSES = ("punctuation", "function", "content", "special")
TEXT_MAX_LEN = 48
"""Longest tokenized sentence of a text batch by default (longer ones are cut)."""
POSITION_BUCKETS = (0, 1, 4, 8, 16)
"""Lower bounds of the position buckets: position 0, 1-3, 4-7, 8-15, 16 and later."""
_FUNCTION_WORD_TEXT = (
    "a an the and or but nor so yet if then else of in on at to for from by with without into "
    "onto over under about as than that this these those it its is are was were be been being "
    "has have had do does did not no can could may might must shall should will would which "
    "who whom whose what when where why how there here all any each every some such only also "
    "very i you he she we they me him her us them my your his our their"
)
FUNCTION_WORDS = frozenset(_FUNCTION_WORD_TEXT.split())
"""English function words (articles, prepositions, pronouns, auxiliaries, conjunctions)."""
_SENTENCE_END = re.compile(r"(?<=[a-z][.!?])\s+(?=[A-Z])")
_CLEAN = re.compile(r"^[A-Z][A-Za-z ,;:'\-]+[a-z][.!?]$")


# ----------------------------------------------------------------------------- sentences


def stdlib_sentences(n: int | None = None, *, min_words: int = 6, max_words: int = 30) -> list[str]:
    """Real English sentences from the standard library's ``pydoc_data.topics``.

    Kept: sentences that start with a capital, end with ``.``, ``!`` or ``?`` after a word,
    hold only letters, spaces and ``, ; : ' -``, and have ``min_words`` to ``max_words`` words;
    duplicates removed, in the order of the topics (deterministic for a Python version).

    Args:
        n: Keep the first ``n`` (None: all, a few hundred).
        min_words, max_words: Sentence length bounds in words.

    Example:
        >>> sentences = stdlib_sentences(3)
        >>> len(sentences), all(s[0].isupper() and s[-1] in ".!?" for s in sentences)
        (3, True)
    """
    from pydoc_data.topics import topics

    min_words = check_int("min_words", min_words, minimum=1)
    max_words = check_int("max_words", max_words, minimum=min_words)
    seen: dict[str, None] = {}
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            if paragraph.startswith((" ", "\t")):  # indented: code or a grammar rule
                continue
            text = " ".join(paragraph.split())
            for sentence in _SENTENCE_END.split(text):
                if _CLEAN.match(sentence) and min_words <= len(sentence.split()) <= max_words:
                    seen.setdefault(sentence, None)
    sentences = list(seen)
    if n is not None:
        n = check_int("n", n, minimum=1, maximum=len(sentences))
        sentences = sentences[:n]
    return sentences


def read_sentences(path: str | Path, n: int | None = None) -> list[str]:
    """Sentences of a user's UTF-8 text file: one per non-empty line (or split at ``. ``).

    Raises:
        ParameterError: The file cannot be read, holds control characters (a binary file:
            NUL bytes are valid UTF-8) or holds no word (the message names it and the line).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise invalid("text", str(path), f"a readable UTF-8 text file ({error})") from None
    _check_no_control_characters(path, text)
    sentences = [
        s.strip()
        for line in text.splitlines()
        for s in _SENTENCE_END.split(" ".join(line.split()))
        if s.strip()
    ]
    if not sentences:
        raise invalid("text", str(path), "a text file with at least one non-empty line")
    if not any(character.isalnum() for sentence in sentences for character in sentence):
        raise invalid("text", str(path), "a text file with words (it holds punctuation only)")
    return sentences if n is None else sentences[: check_int("n", n, minimum=1)]


def _check_no_control_characters(path: Path, text: str) -> None:
    """Refuse control characters other than whitespace (tab, CR, form feed ...): a file of NUL
    bytes decodes as UTF-8, and its tokens were silently dropped, leaving [CLS] [SEP] to
    analyse. Lines are counted at ``\\n``, as an editor and ``grep -n`` count them."""
    for number, line in enumerate(text.split("\n"), start=1):
        bad = next((c for c in line if _is_control(c)), None)
        if bad is not None:
            raise invalid(
                "text",
                str(path),
                f"a text file without control characters (line {number} holds "
                f"U+{ord(bad):04X}: a binary file?)",
            )


def _is_control(character: str) -> bool:
    """A control character (Unicode "Cc") that is not whitespace."""
    return unicodedata.category(character) == "Cc" and not character.isspace()


def cut_sentences(
    model: BridgedModel, sentences: Sequence[str], max_len: int = TEXT_MAX_LEN
) -> tuple[int, int]:
    """``(how many of sentences text_batch cuts at max_len tokens, the longest's tokens)``:
    what a command says, so that a long line is not shortened silently (the batch itself is
    unchanged).

    Example:
        >>> cut_sentences(load_pretrained("minilm"), ["A short one."])  # doctest: +SKIP
        (0, 5)
    """
    if not sentences:
        return 0, 0
    # verbose=False: no "longer than the model's maximum" warning, the caller says it
    lengths = [len(ids) for ids in model.tokenizer(list(sentences), verbose=False)["input_ids"]]
    return sum(length > max_len for length in lengths), max(lengths)


# ----------------------------------------------------------------------------- batch


def text_batch(
    model: BridgedModel,
    sentences: Sequence[str],
    *,
    max_len: int = TEXT_MAX_LEN,
    bos: bool = True,
) -> Batch:
    """Tokenize ``sentences`` with ``model.tokenizer`` into a right-padded ``Batch``.

    **The chat prefix.** TransformerLens sets up a decoder's tokenizer to start every text
    with its BOS token. For SmolLM2-Instruct that token is ``<|im_start|>`` (id 1), the marker
    that opens a chat turn: every sentence then reads ``<|im_start|>The cat sat.``, position 0
    is that token (where the ``first`` relation and attention sinks point) and the first word
    is scored as a next-token target after it. ``bos=False`` drops it, so the text starts at
    its first word (an encoder's ``[CLS]`` ... ``[SEP]`` are always kept: MiniLM's embedding
    is computed with them).

    Args:
        model: A :class:`~mhainterp.protocol.BridgedModel` (its tokenizer and objective).
        sentences: The texts.
        max_len: Longest tokenized sentence (longer ones are cut; :func:`cut_sentences`
            says how many).
        bos: Keep a decoder's BOS prefix (``<|im_start|>`` for SmolLM2; default True).

    Returns:
        A Batch. Next-token objective: ``targets[i, t] = tokens[i, t + 1]``, scored where both
        are real. Embedding objective: every real position scored, targets 0 (placeholders).
    """
    if not sentences:
        raise invalid("sentences", sentences, "at least one sentence")
    max_len = check_int("max_len", max_len, minimum=2)
    encoded = model.tokenizer(
        list(sentences), return_tensors="pt", padding=True, truncation=True, max_length=max_len
    )
    tokens = encoded["input_ids"].long()
    padding_mask = encoded["attention_mask"].bool()
    _check_right_padded(padding_mask)
    bos_id = getattr(model.tokenizer, "bos_token_id", None)
    if not bos and model.cfg.causal and bos_id is not None and bool((tokens[:, 0] == bos_id).all()):
        pad = tokens[padding_mask.logical_not()]
        fill = int(pad[0]) if pad.numel() else 0
        tokens = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], fill)], 1)
        padding_mask = torch.cat([padding_mask[:, 1:], torch.zeros_like(padding_mask[:, :1])], 1)
        keep = int(padding_mask.any(0).nonzero().max()) + 1
        tokens, padding_mask = tokens[:, :keep], padding_mask[:, :keep]
    if model.cfg.objective == "embedding":
        targets = torch.zeros_like(tokens).masked_fill(~padding_mask, IGNORE_INDEX)
        return Batch(tokens=tokens, targets=targets, mask=padding_mask, padding_mask=padding_mask)
    return next_token_batch(tokens, padding_mask)


def next_token_batch(tokens: Int[Tensor, "n T"], padding_mask: Bool[Tensor, "n T"]) -> Batch:
    """Position t scored against token t+1 where both are real.

    Example:
        >>> b = next_token_batch(torch.tensor([[5, 6, 7]]), torch.tensor([[True, True, False]]))
        >>> b.targets.tolist(), b.mask.tolist()
        ([[6, -100, -100]], [[True, False, False]])
    """
    scored = torch.zeros_like(padding_mask)
    scored[:, :-1] = padding_mask[:, :-1] & padding_mask[:, 1:]
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = tokens[:, 1:]
    targets = targets.masked_fill(~scored, IGNORE_INDEX)
    return Batch(tokens=tokens, targets=targets, mask=scored, padding_mask=padding_mask)


def _check_right_padded(padding_mask: Tensor) -> None:
    if bool((padding_mask[:, 1:] & ~padding_mask[:, :-1]).any()):
        raise invalid("tokenizer.padding_side", "left", "'right' (padding at the end)")


# ----------------------------------------------------------------------------- relations


def next_token_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """The next position: ``1`` at ``k = q + 1`` (the last real row is empty).

    Example:
        >>> next_token_template(torch.tensor([[7, 8, 9]]))[0].tolist()
        [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    q, k = query_key_positions(tokens)
    return finish_template((k == q + 1).expand(tokens.shape[0], -1, -1), padding_mask)


def last_real_template(
    tokens: Tensor, padding_mask: Tensor | None = None
) -> Float[Tensor, "n q k"]:
    """The last real token of each sequence ([SEP] for BERT): ``1`` at ``k = L - 1``.

    Example:
        >>> last_real_template(torch.tensor([[7, 8, 0]]), torch.tensor([[1, 1, 0]]).bool())[0]
        tensor([[0., 1., 0.],
                [0., 1., 0.],
                [0., 0., 0.]])
    """
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    _, k = query_key_positions(tokens)
    last = padding_mask.sum(-1)[:, None, None] - 1  # (n, 1, 1)
    return finish_template((k[None] == last).expand(-1, tokens.shape[1], -1), padding_mask)


def punctuation_template(
    tokens: Tensor, padding_mask: Tensor | None, punctuation_ids: Sequence[int]
) -> Float[Tensor, "n q k"]:
    """Every key that holds a punctuation token (``punctuation_ids``), for every query."""
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    ids = torch.as_tensor(list(punctuation_ids), dtype=torch.int64, device=tokens.device)
    is_punct = torch.isin(tokens, ids)  # (n, k)
    return finish_template(is_punct[:, None, :].expand(-1, tokens.shape[1], -1), padding_mask)


def text_relations(
    tokens: Tensor,
    padding_mask: Tensor | None,
    *,
    punctuation_ids: Sequence[int],
    causal: bool,
) -> dict[str, Float[Tensor, "n q k"]]:
    """The :data:`TEXT_RELATIONS` templates; for causal models keys after the query are cut
    (``next`` is then empty and dropped, ``last`` keeps only the last query)."""
    tokens, padding_mask = check_tokens(tokens, padding_mask)
    same = same_token_template(tokens, padding_mask) - self_template(tokens, padding_mask)
    relations = {
        "previous": previous_token_template(tokens, padding_mask),
        "next": next_token_template(tokens, padding_mask),
        "self": self_template(tokens, padding_mask),
        "first": first_position_template(tokens, padding_mask),
        "last": last_real_template(tokens, padding_mask),
        "punctuation": punctuation_template(tokens, padding_mask, punctuation_ids),
        "same_token": same,
    }
    if causal:
        visible = torch.ones(tokens.shape[1], tokens.shape[1], device=tokens.device).tril()
        relations = {name: t * visible for name, t in relations.items() if name != "next"}
    return relations


@dataclass(frozen=True)
class TextRelations:
    """The text relations of one tokenizer and attention direction, in the shape the role
    scores take a task's (``relations(tokens, padding_mask)``; see
    :func:`mhainterp.specialization.where.roles.role_templates`).

    Example:
        >>> rel = TextRelations(punctuation_ids=(9,), causal=False)
        >>> sorted(rel.relations(torch.tensor([[2, 9, 3]])))[:3]
        ['first', 'last', 'next']
    """

    punctuation_ids: tuple[int, ...]
    causal: bool
    name: str = "text"

    def relations(
        self, tokens: Tensor, padding_mask: Tensor | None = None
    ) -> dict[str, Float[Tensor, "n q k"]]:
        """:func:`text_relations` of ``tokens``."""
        return text_relations(
            tokens, padding_mask, punctuation_ids=self.punctuation_ids, causal=self.causal
        )


def punctuation_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's tokens that are punctuation only (``.``, ``,``, ``Ġ.``, ...)."""
    return sorted(
        index
        for token, index in tokenizer.get_vocab().items()
        if (text := _surface(token)) and all(not c.isalnum() and not c.isspace() for c in text)
    )


def _surface(token: str) -> str:
    return token.replace("Ġ", "").replace("▁", "").replace("##", "").strip()


# ----------------------------------------------------------------------------- axes


def text_axes(
    batch: Batch, tokenizer: Any, *, n_frequency_buckets: int = 3
) -> dict[str, Int[Tensor, "n T"]]:
    """Per position, the value of each "whom a head serves" axis (-1 at padding).

    - ``token_class``: index into :data:`TOKEN_CLASSES` of the query token.
    - ``position``: bucket of the position (:data:`POSITION_BUCKETS`).
    - ``target_frequency``: how often the scored target occurs in this batch, cut at the
      count's quantiles into ``n_frequency_buckets`` buckets (0 = rarest; equal counts share a
      bucket); -1 where nothing is scored.
    """
    tokens, real = batch.tokens, batch.padding_mask
    special = set(getattr(tokenizer, "all_special_ids", []))
    punct = set(punctuation_ids(tokenizer))
    classes = torch.full_like(tokens, -1)
    for index, token_id in enumerate(tokens.flatten().tolist()):
        if token_id in special:
            value = 3
        elif token_id in punct:
            value = 0
        else:
            word = _surface(tokenizer.convert_ids_to_tokens(token_id)).lower()
            value = 1 if word in FUNCTION_WORDS else 2
        classes.view(-1)[index] = value
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens).contiguous()
    edges = torch.tensor(POSITION_BUCKETS[1:], device=tokens.device)
    buckets = torch.bucketize(positions, edges, right=True)
    return {
        "token_class": classes.masked_fill(~real, -1),
        "position": buckets.masked_fill(~real, -1),
        "target_frequency": _frequency_buckets(batch, n_frequency_buckets),
    }


def _frequency_buckets(batch: Batch, n_buckets: int) -> Int[Tensor, "n T"]:
    """Quantile buckets of each scored target's count in the batch (0 = rarest)."""
    n_buckets = check_int("n_frequency_buckets", n_buckets, minimum=1)
    scored = batch.mask
    targets = batch.targets[scored]
    counts = Counter(targets.tolist())
    device = batch.tokens.device
    per_target = torch.tensor(
        [counts[t] for t in targets.tolist()], dtype=torch.float64, device=device
    )
    out = torch.full(batch.tokens.shape, -1, dtype=torch.int64, device=device)
    if per_target.numel():
        quantiles = torch.arange(1, n_buckets, dtype=torch.float64, device=device) / n_buckets
        edges = torch.quantile(per_target, quantiles)
        out[scored] = torch.bucketize(per_target, edges)  # a count at an edge goes below it
    return out


# ----------------------------------------------------------------------------- the text task

TEXT_N_EVAL = 64
"""Sentences of a text task's evaluation set by default (``--n-eval`` on text)."""
TEXT_AXES = ("token_class", "position", "target_frequency")
"""The "whom a head serves" axes of a text task (:func:`text_axes`), the division's default."""
_FREQUENCY_NAMES = {1: ["all"], 2: ["rare", "common"], 3: ["rare", "mid", "common"]}


def text_sentences(text: str | Path, n: int | None = None) -> list[str]:
    """``"stdlib"``: :func:`stdlib_sentences`; anything else: a text file
    (:func:`read_sentences`); the first ``n`` (None: all).

    Example:
        >>> len(text_sentences("stdlib", 5))
        5
    """
    sentences = stdlib_sentences() if str(text) == "stdlib" else read_sentences(text)
    return sentences if n is None else sentences[: check_int("n", n, minimum=1)]


class TextTask(Task):
    """Real sentences for a pretrained model, as a :class:`~mhainterp.tasks.Task`: what the
    specialization battery and the division of labour need of a task, from text.

    - the evaluation set: the first ``n_eval`` sentences, tokenized by the model's tokenizer
      (:func:`text_batch`; next-token targets, or the embedding objective's placeholders);
      ``eval_batch(n)`` gives the first ``min(n, n_eval)`` of them; ``sample(n, generator)``
      a random draw of them;
    - the role templates (:data:`TEXT_RELATIONS`: previous, next, self, first, last,
      punctuation, same token) as :meth:`relations`;
    - the text axes (:data:`TEXT_AXES`: query token class, position bucket, target
      frequency) as :meth:`axes`, which the division of labour reads in place of the raw
      token / position / class axes;
    - split halves: the even and the odd sentences (the division's same-function null).

    Args:
        model: A :class:`~mhainterp.protocol.BridgedModel` (its tokenizer, objective,
            attention direction and vocabulary).
        text: ``"stdlib"`` or the path of a UTF-8 text file (one sentence a line).
        n_eval: Sentences in the evaluation set (default :data:`TEXT_N_EVAL`).
        max_len: Longest tokenized sentence (longer ones are cut).
        sentences: The sentences themselves, instead of ``text``.
        bos: Keep a decoder's BOS prefix (SmolLM2's chat marker ``<|im_start|>``; see
            :func:`text_batch`).

    Example:
        >>> task = TextTask(load_pretrained("minilm"), "stdlib", n_eval=8)  # doctest: +SKIP
        >>> task.eval_batch().tokens.shape  # doctest: +SKIP
        torch.Size([8, 34])
    """

    name = "text"
    causal = False

    def __init__(
        self,
        model: Any,
        text: str | Path = "stdlib",
        n_eval: int = TEXT_N_EVAL,
        max_len: int = TEXT_MAX_LEN,
        sentences: Sequence[str] | None = None,
        bos: bool = True,
    ) -> None:
        self.model = model
        self.bos = bool(bos)
        self.text = str(text)
        self.n_eval = check_int("n_eval", n_eval, minimum=1)
        self.max_len = check_int("max_len", max_len, minimum=2)
        chosen = list(sentences) if sentences is not None else text_sentences(text)
        self.sentences = chosen[: self.n_eval]
        self.n_eval = len(self.sentences)
        self._batch = text_batch(model, self.sentences, max_len=self.max_len, bos=self.bos)
        self.causal = bool(model.cfg.causal)
        self._punctuation = tuple(punctuation_ids(model.tokenizer))
        super().__init__(seq_len=self._batch.tokens.shape[1], d_vocab=int(model.cfg.d_vocab))
        self.name = "text" if self.text == "stdlib" else f"text:{Path(self.text).name}"

    @property
    def params(self) -> dict[str, Any]:
        """What identifies the evaluation set (the model is not part of it)."""
        return {"text": self.text, "n_eval": self.n_eval, "max_len": self.max_len, "bos": self.bos}

    @property
    def d_vocab_out(self) -> int:
        """The model's output width (vocabulary, or d_model for the embedding objective)."""
        return int(self.model.cfg.d_vocab_out)

    @property
    def d_vocab_in(self) -> int:
        """The tokenizer's vocabulary (special tokens included)."""
        return int(self.model.cfg.d_vocab)

    @property
    def objective(self) -> str:
        """What the model's output is scored as (``next_token`` or ``embedding``)."""
        return str(self.model.cfg.objective)

    @property
    def relation_names(self) -> list[str]:
        """The :data:`TEXT_RELATIONS` of this attention direction."""
        return list(self.relations(self._batch.tokens[:1], self._batch.padding_mask[:1]))

    def eval_batch(self, n: int = TEXT_N_EVAL) -> Batch:
        """The first ``min(n, n_eval)`` sentences (cut after the last real token)."""
        n = min(check_int("n", n, minimum=1), len(self._batch))
        return _trim(self._batch[:n])

    def sample(self, n: int, generator: torch.Generator | None = None) -> Batch:
        """``n`` sentences of the evaluation set drawn with replacement."""
        n = check_int("n", n, minimum=1)
        rows = torch.randint(0, len(self._batch), (n,), generator=generator)
        return _trim(self._batch[rows])

    def compute_targets(self, tokens: Tensor, padding_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Next-token targets (causal models) or the embedding's placeholders."""
        if self.objective == "embedding":
            return torch.zeros_like(tokens), padding_mask.clone()
        batch = next_token_batch(tokens, padding_mask)
        return batch.targets, batch.mask

    def compute_relations(self, tokens: Tensor, padding_mask: Tensor) -> dict[str, Tensor]:
        """:func:`text_relations` of the tokens."""
        return text_relations(
            tokens, padding_mask, punctuation_ids=self._punctuation, causal=self.causal
        )

    def relations(
        self, tokens: Tensor, padding_mask: Tensor | None = None
    ) -> dict[str, Float[Tensor, "n q k"]]:
        """:func:`text_relations` of any tokenized batch (any number of positions)."""
        return self.compute_relations(*check_tokens(tokens, padding_mask))

    def axes(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, list[str]]]:
        """Per ``[n, T]`` position of ``batch``, the id of its value on each of
        :data:`TEXT_AXES` (-1 where none), and each axis's value names.

        Example:
            >>> ids, names = task.axes(task.eval_batch())  # doctest: +SKIP
            >>> names["token_class"]  # doctest: +SKIP
            ['punctuation', 'function', 'content', 'special']
        """
        values = text_axes(batch, self.model.tokenizer)
        bounds = [*POSITION_BUCKETS, None]
        positions = [
            str(lo) if hi == lo + 1 else (f"{lo}+" if hi is None else f"{lo}-{hi - 1}")
            for lo, hi in itertools.pairwise(bounds)
        ]
        names = {
            "token_class": list(TOKEN_CLASSES),
            "position": positions,
            "target_frequency": _FREQUENCY_NAMES[3],
        }
        if self.objective == "embedding":  # no targets: the frequency of the token itself
            values["target_frequency"] = _token_frequency_buckets(batch, 3)
        return values, names


def _token_frequency_buckets(batch: Batch, n_buckets: int) -> Int[Tensor, "n T"]:
    """:func:`_frequency_buckets` of the tokens themselves (an embedding model has no
    target: its scored position's own token is what the frequency describes)."""
    as_targets = batch.tokens.masked_fill(~batch.padding_mask, IGNORE_INDEX)
    mirror = Batch(
        tokens=batch.tokens,
        targets=as_targets,
        mask=batch.padding_mask,
        padding_mask=batch.padding_mask,
    )
    return _frequency_buckets(mirror, n_buckets)


def _trim(batch: Batch) -> Batch:
    """``batch`` cut after its last real position (a subset needs fewer positions)."""
    T = int(batch.padding_mask.any(0).nonzero().max()) + 1
    return Batch(
        tokens=batch.tokens[:, :T],
        targets=batch.targets[:, :T],
        mask=batch.mask[:, :T],
        padding_mask=batch.padding_mask[:, :T],
    )
