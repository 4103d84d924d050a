"""Stage 07: BERT's pretraining data (MLM, NSP) and heads (CURRICULUM.md, 07_bert_pretraining).

The two data functions are graded exactly, through drivers (autograder/runtime/drivers/pretraining.py):
the same ``random.Random(seed)`` in must give the same tokens, positions and labels out and
leave the rng in the same state as the original BERT release's create_pretraining_data.py
(tests/reference proves the reference equals that script). Their cases run on synthetic
vocabularies and on the stage's corpus (solutions/07_bert_pretraining/corpus.txt, shipped
with the notebook) split into real WordPieces by BERT's uncased vocabulary.

``mask_tokens`` is random by design and graded statistically: its driver calls it
``repeats`` times with one seeded generator and returns rates plus exact 0/1 checks. The
rates' tolerance is a Hoeffding bound (see ``_rates_tolerance``): a correct ``mask_tokens``
fails a case with probability below 4e-8, a test (at most three cases) below 1.2e-7.
"""

from __future__ import annotations

import functools
import linecache
import math
import random
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import reference
from autograder.runtime.drivers.bert import minilm_tokenizer
from autograder.runtime.drivers.pretraining import vocab_words as case_vocab
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Tolerance,
    Variant,
    rand,
    randint,
    randn,
)

ref = reference.load("07_bert_pretraining")

CORPUS = Path(__file__).resolve().parents[2] / "solutions" / "07_bert_pretraining" / "corpus.txt"
REAL_VOCAB = "bert-base-uncased"  # a case's vocab_words: the driver reads vocab.txt (30522 words)
MASK_ID = 103  # [MASK] in BERT's uncased vocabulary
PAD_ID, CLS_ID, SEP_ID = 0, 101, 102

# -- the corpus, as WordPieces ----------------------------------------------------------------


def wordpieces(sentence: str) -> list[str]:
    """BERT's uncased WordPieces of one sentence, without [CLS]/[SEP]."""
    return list(minilm_tokenizer().encode(sentence, add_special_tokens=False).tokens)


@functools.cache
def corpus_documents() -> tuple[tuple[tuple[str, ...], ...], ...]:
    """corpus.txt as documents (blank-line separated) of sentences (one per line), as
    WordPieces: the input format of the original create_pretraining_data.py."""
    documents, current = [], []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            current.append(tuple(wordpieces(line.strip())))
        elif current:
            documents.append(tuple(current))
            current = []
    if current:
        documents.append(tuple(current))
    return tuple(documents)


def _as_lists(documents) -> list[list[list[str]]]:
    return [[list(s) for s in doc] for doc in documents]


# -- synthetic vocabularies and documents ---------------------------------------------------


def _synthetic_vocab(n: int) -> list[str]:
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(n))]


def _segment(rng: random.Random, n_words: int, length: int) -> list[str]:
    return [f"w{rng.randrange(n_words)}" for _ in range(length)]


def _synthetic_documents(
    g: torch.Generator, n_docs: int, segments: tuple[int, int], length: tuple[int, int], n_words: int
) -> list[list[list[str]]]:
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=g)))
    return [
        [_segment(rng, n_words, rng.randint(*length)) for _ in range(rng.randint(*segments))]
        for _ in range(n_docs)
    ]


def _seed(g: torch.Generator) -> int:
    return int(torch.randint(0, 2**62, (1,), generator=g))


# -- rng states with a draw exactly on its threshold ----------------------------------------------
#
# The contract's thresholds are strict (`rng.random() < 0.8`). `<=` differs only when a draw
# equals the threshold, which a seeded rng does with probability 2^-53 per draw; but the
# contract grades any rng state ("same rng state in"), and random() returns k / 2^53, so a
# state can put a draw exactly on 0.8, 0.5 or a dyadic short_seq_prob. Such a case hands the
# driver a state (setstate's) whose outputs are random.Random(seed)'s first 624 words but for
# the two words of each landed draw.

MT_WORDS = 624  # random.Random outputs temper(word) for each state word in turn, then regenerates


def _untemper(y: int) -> int:
    """The MT19937 state word that random.Random tempers into the output ``y``."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(4):  # each pass recovers 7 more bits of y = x ^ ((x << 7) & mask)
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x & 0xFFFFFFFF
    x = y
    for _ in range(2):  # and 11 more of y = x ^ (x >> 11)
        x = y ^ (x >> 11)
    return x


def _record_draws(state: tuple, run) -> list[tuple[str, str, int, float]]:
    """``run(rng)`` on an rng in ``state``: each rng.random() as (calling function, its source
    line, index of its first output word, value)."""
    rng = random.Random()
    rng.setstate(state)
    draws, draw = [], rng.random

    def recorded() -> float:
        caller, position = sys._getframe(1), rng.getstate()[1][-1]
        value = draw()
        line = linecache.getline(caller.f_code.co_filename, caller.f_lineno)
        draws.append((caller.f_code.co_name, line, position, value))
        return value

    rng.random = recorded  # an instance attribute: shuffle and randint still use getrandbits
    run(rng)
    return draws


def landed_rng_state(seed: int, run, landings: tuple[tuple[str, str, float], ...]) -> list[int]:
    """The state of an rng whose outputs are ``random.Random(seed)``'s, except that for each
    (function, threshold, value) in turn, the first ``rng.random() < threshold`` draw made in
    that function while ``run(rng)`` runs the reference is exactly ``value``. Raises when a
    landing cannot happen (no such draw, or one past the first 624 words)."""
    source = random.Random(seed)
    outputs = [source.getrandbits(32) for _ in range(MT_WORDS)]

    def state() -> tuple:
        return (3, (*(_untemper(o) for o in outputs), 0), None)

    def first(draws, function: str, threshold: str):
        at = [d for d in draws if d[0] == function and f"rng.random() < {threshold}" in d[1]]
        if not at or at[0][2] + 2 > MT_WORDS:
            raise ValueError(f"no draw of rng.random() < {threshold} in {function} to land")
        return at[0]

    for function, threshold, value in landings:
        k = value * 2**53  # random() = (a * 2^26 + b) / 2^53, a = word >> 5, b = next word >> 6
        if k != int(k) or not 0 <= k < 2**53:
            raise ValueError(f"random() never returns {value!r}")
        position = first(_record_draws(state(), run), function, threshold)[2]
        outputs[position] = (int(k) >> 26) << 5 | outputs[position] & 31
        outputs[position + 1] = (int(k) & (2**26 - 1)) << 6 | outputs[position + 1] & 63
    draws = _record_draws(state(), run)
    for function, threshold, value in landings:
        if first(draws, function, threshold)[3] != value:
            raise AssertionError(f"the draw of rng.random() < {threshold} in {function} is not {value}")
    return list(state()[1])


# -- create_masked_lm_predictions ---------------------------------------------------------------


def _pair(a: list[str], b: list[str]) -> list[str]:
    return ["[CLS]", *a, "[SEP]", *b, "[SEP]"]


def _mlm_synthetic(len_a: int, len_b: int, n_words: int = 50, options: tuple = (), landings: tuple = ()):
    """``landings``: draws the rng makes exactly on their threshold (``landed_rng_state``)."""

    def build(g, dtype):
        rng = random.Random(_seed(g))
        tokens = _pair(_segment(rng, n_words, len_a), _segment(rng, n_words, len_b))
        kwargs = {"tokens": tokens, "vocab_words": _synthetic_vocab(n_words), "seed": _seed(g)}
        if landings:
            vocab = kwargs["vocab_words"]
            kwargs["rng_state"] = landed_rng_state(
                kwargs["seed"],
                lambda r: ref.create_masked_lm_predictions(list(tokens), vocab, r, *options),
                landings,
            )
        return CaseData(kwargs={**kwargs, "options": list(options)})

    return build


def _mlm_real(doc: int, options: tuple = ()):
    def build(g, dtype):
        sentences = corpus_documents()[doc]
        tokens = _pair(list(sentences[0]), [t for s in sentences[1:] for t in s])
        kwargs = {"tokens": tokens, "vocab_words": REAL_VOCAB, "seed": _seed(g), "options": list(options)}
        return CaseData(kwargs=kwargs)

    return build


def _masking(*, specials_are_candidates: bool = False, always_mask: bool = False):
    """create_masked_lm_predictions with one of the stage's known mistakes."""

    def create_masked_lm_predictions(
        tokens, vocab_words, rng, masked_lm_prob=0.15, max_predictions_per_seq=20
    ):
        candidates = [
            i for i, t in enumerate(tokens) if specials_are_candidates or t not in ("[CLS]", "[SEP]")
        ]
        rng.shuffle(candidates)
        output = list(tokens)
        n = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
        for index in candidates[:n]:
            if always_mask or rng.random() < 0.8:
                output[index] = "[MASK]"
            elif rng.random() < 0.5:
                output[index] = tokens[index]
            else:
                output[index] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        chosen = sorted(candidates[:n])
        return output, chosen, [tokens[i] for i in chosen]

    return create_masked_lm_predictions


MASKS_SPECIALS = _masking(specials_are_candidates=True)
ALWAYS_MASK = _masking(always_mask=True)

# -- create_instances_from_document ---------------------------------------------------------------


def _with_masking(masking) -> Any:
    """The reference's create_instances_from_document calling ``masking`` instead of its own
    create_masked_lm_predictions: a student's pipeline run on their own mistaken masking."""
    fn = ref.create_instances_from_document
    namespace = {**vars(ref), "create_masked_lm_predictions": masking}
    return types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


def _instances_case(
    documents,
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    vocab=None,
    landings: tuple = (),
):
    """``documents``: a function of the generator giving the corpus (lists of WordPieces);
    ``landings``: draws the rng makes exactly on their threshold (``landed_rng_state``)."""

    def build(g, dtype):
        docs = documents(g)
        kwargs = {
            "all_documents": docs,
            "document_index": document_index if document_index >= 0 else len(docs) + document_index,
            "max_seq_length": max_seq_length,
            "short_seq_prob": short_seq_prob,
            "masked_lm_prob": masked_lm_prob,
            "max_predictions_per_seq": max_predictions,
            "vocab_words": vocab if vocab is not None else REAL_VOCAB,
            "seed": _seed(g),
        }
        if landings:
            vocab_words = case_vocab(kwargs)

            def run(rng):
                return ref.create_instances_from_document(
                    _as_lists(docs),
                    kwargs["document_index"],
                    max_seq_length,
                    short_seq_prob,
                    masked_lm_prob,
                    max_predictions,
                    vocab_words,
                    rng,
                )

            kwargs["rng_state"] = landed_rng_state(kwargs["seed"], run, landings)
        return CaseData(kwargs=kwargs)

    return build


def _real_corpus(g):
    return _as_lists(corpus_documents())


def _synthetic(n_docs, segments, length, n_words=40):
    return lambda g: _synthetic_documents(g, n_docs, segments, length, n_words)


def _one_word_segments(n_docs: int, segments: tuple[int, int], last: int, n_words: int = 40):
    """``n_docs - 1`` documents of ``segments`` one-word segments, then one of ``last``: every
    chunk and every B reaches its target length exactly, and indices pass 256 (the last small
    int CPython caches, where ``is`` stops meaning ``==``)."""

    def documents(g):
        rng = random.Random(_seed(g))
        sizes = [rng.randint(*segments) for _ in range(n_docs - 1)] + [last]
        return [[_segment(rng, n_words, 1) for _ in range(size)] for size in sizes]

    return documents


# -- mask_tokens ----------------------------------------------------------------------------------


def _real_batch(n_pairs: int, length: int) -> tuple[Tensor, Tensor]:
    """Sentence pairs of the corpus as BERT input ids ([CLS] A [SEP] B [SEP], [PAD] after),
    (n_pairs, length) int64, and their special-tokens mask (True at [CLS], [SEP], [PAD])."""
    sentences = [s for doc in corpus_documents() for s in doc]
    vocab = {w: i for i, w in enumerate(_real_vocab())}
    ids = torch.full((n_pairs, length), PAD_ID, dtype=torch.int64)
    for row in range(n_pairs):
        a, b = sentences[(2 * row) % len(sentences)], sentences[(2 * row + 1) % len(sentences)]
        pair = [vocab[t] for t in _pair(list(a), list(b))][: length - 1] + [SEP_ID]
        ids[row, : len(pair)] = torch.tensor(pair)
    special = (ids == PAD_ID) | (ids == CLS_ID) | (ids == SEP_ID)
    return ids, special


@functools.cache
def _real_vocab() -> tuple[str, ...]:
    from autograder.runtime.drivers.pretraining import real_vocab

    return real_vocab()


def _mask_case(
    shape: tuple[int, int],
    vocab_size: int,
    mask_id: int,
    repeats: int,
    mlm_probability: float | None = None,
    real: bool = False,
):
    def build(g, dtype):
        if real:
            ids, special = _real_batch(*shape)
        else:
            b, length = shape
            ids = randint(g, 5, vocab_size, b, length)  # 0-4 are specials, as in _synthetic_vocab
            lengths = randint(g, 3, length + 1, b)
            lengths[0] = length
            ids[torch.arange(length)[None, :] >= lengths[:, None]] = 0  # [PAD]
            ids[:, 0] = 2  # [CLS]
            ids[torch.arange(b), lengths - 1] = 3  # [SEP]
            special = ids < 5
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "special_tokens_mask": special,
            "vocab_size": vocab_size,
            "mask_token_id": mask_id,
            "seed": _seed(g) % 2**62,
            "repeats": repeats,
        }
        if mlm_probability is not None:
            kwargs["mlm_probability"] = mlm_probability
        return CaseData(kwargs=kwargs)

    return build


def _plain_case(shape: tuple[int, int], vocab_size: int, mask_id: int, repeats: int, mlm_probability: float):
    """Ids in [5, vocab_size): a batch of single tokens (L = 1) has no room for [CLS] ...
    [SEP], so every eighth row is a lone special token ([CLS], id 2) and the others are
    candidates."""

    def build(g, dtype):
        ids = randint(g, 5, vocab_size, *shape)
        ids[::8] = 2
        kwargs = {
            "input_ids": ids,
            "special_tokens_mask": ids < 5,
            "vocab_size": vocab_size,
            "mask_token_id": mask_id,
            "seed": _seed(g) % 2**62,
            "repeats": repeats,
            "mlm_probability": mlm_probability,
        }
        return CaseData(kwargs=kwargs)

    return build


def _two_ids_case(shape: tuple[int, int], repeats: int, mlm_probability: float):
    """vocab_size 2: id 0 is [MASK] (and the special first column), every word is id 1. A
    random id is then the mask id or the word itself, half of the time each; ids drawn from
    [0, 1) (one too few) or [0, 3) (one too many) move the rates by 0.05 and 0.033, where
    with a large vocabulary they move them by 1/V."""

    def build(g, dtype):
        ids = torch.ones(shape, dtype=torch.int64)
        ids[:, 0] = 0
        kwargs = {
            "input_ids": ids,
            "special_tokens_mask": ids == 0,
            "vocab_size": 2,
            "mask_token_id": 0,
            "seed": _seed(g),
            "repeats": repeats,
            "mlm_probability": mlm_probability,
        }
        return CaseData(kwargs=kwargs)

    return build


# Per case and per mask_tokens (the student's, or the reference's), four rates deviate from
# their means: the selection rate over n non-special tokens, and three fractions over the
# m selected ones. Hoeffding: P(|rate - mean| > t) <= 2 exp(-2 n t^2). With each of the four
# bounds at DELTA, a correct mask_tokens has all four rates within t of the means but with
# probability <= 4 * DELTA = 4e-8, and the grader's and the student's rates (same means) then
# differ by at most 2t. (The reference's rates are fixed by the case's seed; the stage's tests
# check they lie within t of the contract's exact means.)
DELTA = 1e-8


def rate_bounds(data: CaseData) -> tuple[float, float]:
    """(t for the selection rate, t for the fractions of selected tokens) of a mask_tokens case."""
    kw = data.kwargs
    p = kw.get("mlm_probability", 0.15)
    n = kw["repeats"] * int((~kw["special_tokens_mask"]).sum())
    t_select = math.sqrt(math.log(2 / DELTA) / (2 * n))
    m = n * (p - t_select)  # fewest selected tokens when the selection rate is within t_select
    return t_select, math.sqrt(math.log(2 / DELTA) / (2 * m))


def _rates_tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
    return Tolerance(rtol=0.0, atol=2 * max(rate_bounds(data)))


def _ignores_special_mask(
    input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, mlm_probability=0.15
):
    return ref.mask_tokens(
        input_ids,
        torch.zeros_like(special_tokens_mask),
        vocab_size,
        mask_token_id,
        generator,
        mlm_probability,
    )


def _masks_every_selected(
    input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, mlm_probability=0.15
):
    probability = torch.full(input_ids.shape, mlm_probability, device=input_ids.device)
    probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    return torch.where(selected, torch.full_like(input_ids, mask_token_id), input_ids), labels


# -- heads and loss -------------------------------------------------------------------------------


def _heads_case(
    b: int, length: int, hidden: int, vocab: int, eps: float | None = 1e-12, dense_scale: float = 1.0
):
    """``eps=None``: the driver builds the heads without eps (its default). ``dense_scale`` scales
    the dense layer: at 1e-6 the LayerNorm's input has a variance near 1e-13, where an eps of
    1e-12 or 0 gives another result (with a variance near 1, only 1e-12 apart)."""

    def build(g, dtype):
        weights = {
            "dense.weight": randn(g, hidden, hidden, dtype=dtype, scale=dense_scale * hidden**-0.5),
            "dense.bias": randn(g, hidden, dtype=dtype, scale=dense_scale * 0.1),
            "layer_norm.weight": 1.0 + randn(g, hidden, dtype=dtype, scale=0.2),
            "layer_norm.bias": randn(g, hidden, dtype=dtype, scale=0.1),
            "bias": randn(g, vocab, dtype=dtype, scale=0.1),
            "pooler.weight": randn(g, hidden, hidden, dtype=dtype, scale=hidden**-0.5),
            "pooler.bias": randn(g, hidden, dtype=dtype, scale=0.1),
            "seq_relationship.weight": randn(g, 2, hidden, dtype=dtype, scale=hidden**-0.5),
            "seq_relationship.bias": randn(g, 2, dtype=dtype, scale=0.1),
        }
        kwargs = {
            "embedding_weight": randn(g, vocab, hidden, dtype=dtype, scale=0.5),
            "weights": weights,
            "sequence_output": randn(g, b, length, hidden, dtype=dtype),
        }
        return CaseData(kwargs=kwargs if eps is None else {**kwargs, "eps": eps})

    return build


def _loss_case(b: int, length: int, vocab: int, labelled: float, scale: float = 2.0):
    def build(g, dtype):
        labels = randint(g, 0, vocab, b, length)
        keep = rand(g, b, length) < labelled
        keep[:, 0] = True  # every row predicts something
        labels[~keep] = -100
        nsp = randint(g, 0, 2, b)
        nsp[0] = 0
        return CaseData(
            args=(
                randn(g, b, length, vocab, dtype=dtype, scale=scale),
                randn(g, b, 2, dtype=dtype, scale=scale),
                labels,
                nsp,
            )
        )

    return build


def _nsp_flipped(prediction_scores, seq_relationship_scores, masked_lm_labels, next_sentence_labels):
    return ref.pretraining_loss(
        prediction_scores, seq_relationship_scores, masked_lm_labels, 1 - next_sentence_labels
    )


def _mlm_over_all_positions(
    prediction_scores, seq_relationship_scores, masked_lm_labels, next_sentence_labels
):
    vocab = prediction_scores.size(-1)
    per_token = F.cross_entropy(
        prediction_scores.reshape(-1, vocab), masked_lm_labels.reshape(-1), reduction="none"
    )  # 0 where the label is -100
    nsp = F.cross_entropy(seq_relationship_scores, next_sentence_labels)
    return per_token.mean() + nsp


# -- graded names ---------------------------------------------------------------------------------

MLM_PREDICTIONS = Graded(
    name="create_masked_lm_predictions",
    clause="07.create_masked_lm_predictions",
    task=1,
    signature="create_masked_lm_predictions(tokens, vocab_words, rng, masked_lm_prob=0.15, "
    "max_predictions_per_seq=20) -> (output_tokens, masked_positions, masked_labels)",
    outputs=(
        "output_tokens (as vocabulary ids)",
        "masked_positions",
        "masked_labels (as vocabulary ids)",
        "the rng's next 4 getrandbits(63) draws after your call",
    ),
    reference=ref.create_masked_lm_predictions,
    kind="driver",
    driver="pretraining:masked_lm",
    variants=(Variant("masks-special-tokens", MASKS_SPECIALS), Variant("no-80-10-10", ALWAYS_MASK)),
    # [CLS] a [SEP] b [SEP] and a little longer, in a vocabulary of a few words
    small=(
        _mlm_synthetic(1, 1, n_words=2),
        _mlm_synthetic(2, 1, n_words=2),
        _mlm_synthetic(2, 2, n_words=3, options=(0.5, 20)),
        # 10 tokens at the default 0.15: 1.5 predictions, 2 (at 0.1, another default, 1)
        _mlm_synthetic(4, 3, n_words=3),
        # 9 tokens at 0.5: 4.5 predictions of 6 words, which round() takes to 4 and
        # int(x + 0.5) to 5
        _mlm_synthetic(3, 3, n_words=3, options=(0.5, 20)),
        _mlm_synthetic(3, 3, n_words=3),
    ),
    tests=(
        Test(
            "a sentence pair, synthetic vocabulary",
            torch.int64,
            points=2,
            hidden=False,
            cases=(
                Case("20 + 17 words, defaults", _mlm_synthetic(20, 17)),
                Case("8 + 9 words, masked_lm_prob=0.3, max 20", _mlm_synthetic(8, 9, options=(0.3, 20))),
            ),
        ),
        Test(
            "real WordPieces, BERT's vocabulary",
            torch.int64,
            points=1,
            hidden=False,
            cases=(Case("corpus document 0, defaults", _mlm_real(0)),),
        ),
        Test(
            "more seeds, lengths and caps",
            torch.int64,
            points=2,
            cases=(
                # 5 x 0.05 rounds to 0: max(1, ...) still predicts one
                Case(
                    "1 + 1 words, masked_lm_prob=0.05 (one prediction)", _mlm_synthetic(1, 1, options=(0.05,))
                ),
                # 143 x 0.15 rounds to 21: only the default cap (omitted) makes it 20
                Case("70 + 70 words, defaults: the cap of 20 binds", _mlm_synthetic(70, 70)),
                # 30 x 0.15 is 4.5 exactly in binary: round() gives 4 (half to even), int(x + 0.5) 5
                Case("13 + 14 words, defaults: 4.5 predictions round to 4", _mlm_synthetic(13, 14)),
                Case("30 + 30 words, max 5", _mlm_synthetic(30, 30, options=(0.15, 5))),
                # the first chosen position's draws are exactly 0.8, then 0.5: a random word,
                # where `<=` would give [MASK], or keep the token
                Case(
                    "10 + 10 words, an rng whose draws land on 0.8 and 0.5 exactly",
                    _mlm_synthetic(
                        10,
                        10,
                        landings=(
                            ("create_masked_lm_predictions", "0.8", 0.8),
                            ("create_masked_lm_predictions", "0.5", 0.5),
                        ),
                    ),
                ),
                Case(
                    "4 + 3 words, masked_lm_prob=0.9 (more than the candidates)",
                    _mlm_synthetic(4, 3, options=(0.9, 20)),
                ),
                # 7 words: randint(0, 6) draws 3 bits, a bound one higher 4, so the rng diverges at
                # the first random word (a wrong bound of the same bit length only shows on a rare draw)
                Case(
                    "25 + 25 words, 2-word vocabulary (7 with the specials), masked_lm_prob=0.9, max 40",
                    _mlm_synthetic(25, 25, n_words=2, options=(0.9, 40)),
                ),
            ),
        ),
        Test(
            "real WordPieces, other documents",
            torch.int64,
            points=1,
            cases=(
                Case("corpus document 6, masked_lm_prob=0.2", _mlm_real(6, options=(0.2, 20))),
                Case("corpus document 30, max 3", _mlm_real(30, options=(0.15, 3))),
            ),
        ),
    ),
)

INSTANCES = Graded(
    name="create_instances_from_document",
    clause="07.create_instances_from_document",
    task=2,
    signature="create_instances_from_document(all_documents, document_index, max_seq_length, "
    "short_seq_prob, masked_lm_prob, max_predictions_per_seq, vocab_words, rng) -> list[TrainingInstance]",
    outputs=(
        "number of instances and each one's length",
        "tokens (as vocabulary ids, all instances)",
        "segment_ids (all instances)",
        "is_random_next (0/1 per instance)",
        "masked_lm_positions (all instances)",
        "masked_lm_labels (as vocabulary ids, all instances)",
        "the rng's next 4 getrandbits(63) draws after your call",
    ),
    reference=ref.create_instances_from_document,
    kind="driver",
    driver="pretraining:instances",
    variants=(
        Variant("masks-special-tokens", _with_masking(MASKS_SPECIALS)),
        Variant("no-80-10-10", _with_masking(ALWAYS_MASK)),
    ),
    # two short documents of one to three segments, in a vocabulary of a few words
    small=(
        _instances_case(_synthetic(2, (1, 2), (1, 2), n_words=3), 0, 8, 0.1, vocab=_synthetic_vocab(3)),
        _instances_case(_synthetic(2, (2, 3), (1, 3), n_words=3), 1, 10, 0.1, vocab=_synthetic_vocab(3)),
        _instances_case(_synthetic(3, (2, 3), (2, 3), n_words=4), 0, 12, 0.0, vocab=_synthetic_vocab(4)),
    ),
    tests=(
        Test(
            "real WordPieces: the stage's corpus",
            torch.int64,
            points=2,
            hidden=False,
            cases=(
                Case(
                    "document 0, max_seq_length=32, short_seq_prob=0.1",
                    _instances_case(_real_corpus, 0, 32, 0.1),
                ),
                Case(
                    "document 9, max_seq_length=64, short_seq_prob=0",
                    _instances_case(_real_corpus, 9, 64, 0.0),
                ),
            ),
        ),
        Test(
            "synthetic documents",
            torch.int64,
            points=1,
            hidden=False,
            cases=(
                Case(
                    "6 documents, max_seq_length=24",
                    _instances_case(_synthetic(6, (2, 6), (3, 9)), 2, 24, 0.1, vocab=_synthetic_vocab(40)),
                ),
            ),
        ),
        Test(
            "long documents, short_seq_prob 0 and 1, a small max_seq_length",
            torch.int64,
            points=2,
            cases=(
                Case(
                    "long documents, max_seq_length=128, short_seq_prob=0",
                    _instances_case(
                        _synthetic(5, (20, 40), (5, 30)), 1, 128, 0.0, vocab=_synthetic_vocab(40)
                    ),
                ),
                # randint(2, max_num_tokens) draws 6 bits for 64 and 7 for 65: a bound off by one
                # either way draws another target length from the first draw
                Case(
                    "short_seq_prob=1, max_seq_length=67: target lengths 2 to 64",
                    _instances_case(_synthetic(5, (20, 30), (2, 8)), 0, 67, 1.0, vocab=_synthetic_vocab(40)),
                ),
                Case(
                    "short_seq_prob=1, max_seq_length=68: target lengths 2 to 65",
                    _instances_case(_synthetic(5, (20, 30), (2, 8)), 1, 68, 1.0, vocab=_synthetic_vocab(40)),
                ),
                # the first draws against short_seq_prob, of a random next sentence and of
                # truncate_seq_pair's side are exactly their thresholds: the strict `<` says no
                Case(
                    "max_seq_length=24, short_seq_prob=0.5, an rng whose draws land on each threshold",
                    _instances_case(
                        _synthetic(4, (4, 8), (3, 9)),
                        1,
                        24,
                        0.5,
                        vocab=_synthetic_vocab(40),
                        landings=(
                            ("create_instances_from_document", "short_seq_prob", 0.5),
                            ("create_instances_from_document", "0.5", 0.5),
                            ("truncate_seq_pair", "0.5", 0.5),
                        ),
                    ),
                ),
                Case(
                    "max_seq_length=8 (truncation every time)",
                    _instances_case(_synthetic(4, (3, 6), (4, 12)), 3, 8, 0.1, vocab=_synthetic_vocab(40)),
                ),
                Case(
                    "the corpus's last document, max_seq_length=48, masked_lm_prob=0.3, max 4",
                    _instances_case(_real_corpus, -1, 48, 0.2, masked_lm_prob=0.3, max_predictions=4),
                ),
            ),
        ),
        Test(
            "a single-document corpus, one-segment documents",
            torch.int64,
            points=1,
            cases=(
                Case(
                    "one document: 'random' B comes from itself after 10 tries",
                    _instances_case(_synthetic(1, (6, 10), (2, 6)), 0, 20, 0.1, vocab=_synthetic_vocab(40)),
                ),
                Case(
                    "documents of one segment each",
                    _instances_case(_synthetic(8, (1, 1), (3, 20)), 4, 16, 0.1, vocab=_synthetic_vocab(40)),
                ),
                # CPython caches the ints up to 256, so `is` agrees with `==` below them only: 4 of
                # the ~430 draws of another document are document 257 itself (`is not` takes it as
                # another), and the last chunk, one segment, is cut only by i == len(document) - 1
                Case(
                    "258 documents of one-word segments, max_seq_length=5: pairs from document 257",
                    _instances_case(
                        _one_word_segments(258, (2, 4), 1200), -1, 5, 0.0, vocab=_synthetic_vocab(40)
                    ),
                ),
            ),
        ),
    ),
)

MASK_OUTPUTS = (
    "fraction of non-special tokens selected (label != -100)",
    "fraction of selected tokens set to mask_token_id",
    "fraction of selected tokens set to another id",
    "fraction of selected tokens left unchanged",
    "special tokens never selected nor changed (1 = yes)",
    "labels = original id where selected, -100 elsewhere; unselected tokens unchanged (1 = yes)",
    "same generator seed, same output whatever the global RNG (1 = yes)",
)

MASK_TOKENS = Graded(
    name="mask_tokens",
    clause="07.mask_tokens",
    task=3,
    signature="mask_tokens(input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, "
    "mlm_probability=0.15) -> (input_ids, labels)",
    outputs=MASK_OUTPUTS,
    reference=ref.mask_tokens,
    kind="driver",
    driver="pretraining:mask_statistics",
    tolerance=_rates_tolerance,
    variants=(
        Variant("masks-special-tokens", _ignores_special_mask),
        Variant("no-80-10-10", _masks_every_selected),
    ),
    # Graded statistically: a rate is told apart only over thousands of tokens (each within
    # its Hoeffding bound), so the smallest input is one short row, called 600 times.
    small=(
        _mask_case((1, 8), 8, 4, 600, mlm_probability=0.5),
        _two_ids_case((1, 8), 600, mlm_probability=0.5),
        _mask_case((2, 8), 10, 4, 600),
    ),
    dims=(
        Dim("B", lambda c: c.kwargs["input_ids"].shape[0]),
        Dim("L", lambda c: c.kwargs["input_ids"].shape[1]),
    ),
    tests=(
        Test(
            "real sentence pairs, 600 seeded calls",
            torch.int64,
            points=2,
            hidden=False,
            cases=(
                Case(
                    "32 pairs padded to 48, BERT's vocabulary",
                    _mask_case((32, 48), 30522, MASK_ID, 600, real=True),
                ),
            ),
        ),
        Test(
            "random ids, other probabilities",
            torch.int64,
            points=2,
            cases=(
                Case("B=32, L=64, vocab 50, 300 calls", _mask_case((32, 64), 50, 4, 300)),
                Case(
                    "B=8, L=128, vocab 1000, mlm_probability=0.3, 300 calls",
                    _mask_case((8, 128), 1000, 4, 300, mlm_probability=0.3),
                ),
                Case(
                    "B=16, L=64, vocab 2 (mask id 0), mlm_probability=0.5, 300 calls",
                    _two_ids_case((16, 64), 300, mlm_probability=0.5),
                ),
                Case(
                    "B=1, L=256, vocab 50, mlm_probability=0.5, 300 calls",
                    _mask_case((1, 256), 50, 4, 300, mlm_probability=0.5),
                ),
                Case(
                    "B=256, L=1, vocab 50, every eighth row [CLS], mlm_probability=0.5, 300 calls",
                    _plain_case((256, 1), 50, 4, 300, mlm_probability=0.5),
                ),
            ),
        ),
    ),
)

HEADS = Graded(
    name="BertPretrainingHeads",
    clause="07.BertPretrainingHeads",
    task=4,
    signature="BertPretrainingHeads(hidden_size, vocab_size, word_embeddings, eps=1e-12); "
    "forward(sequence_output) -> (prediction_scores, seq_relationship_scores)",
    outputs=(
        "prediction_scores",
        "seq_relationship_scores",
        "decoder.weight is word_embeddings.weight (1 = yes)",
    ),
    reference=ref.BertPretrainingHeads,
    kind="driver",
    driver="pretraining:heads",
    # H = 2 and 3 (a LayerNorm over one unit is its bias, over two only a sign), a vocabulary of two
    small=(_heads_case(1, 1, 2, 2), _heads_case(1, 1, 3, 2), _heads_case(2, 2, 3, 3, eps=1e-5)),
    dims=(
        Dim("B", lambda c: c.kwargs["sequence_output"].shape[0]),
        Dim("L", lambda c: c.kwargs["sequence_output"].shape[1]),
        Dim("H", lambda c: c.kwargs["sequence_output"].shape[2]),
        Dim("V", lambda c: c.kwargs["embedding_weight"].shape[0]),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=2, L=5, H=16, V=40", _heads_case(2, 5, 16, 40)),),
        ),
        Test(
            "float64",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("B=3, L=4, H=8, V=30", _heads_case(3, 4, 8, 30)),),
        ),
        Test(
            "float64, other sizes",
            torch.float64,
            points=1,
            cases=(
                Case("B=1, L=1, H=4, V=7, eps=1e-5", _heads_case(1, 1, 4, 7, eps=1e-5)),
                Case("B=4, L=9, H=32, V=100", _heads_case(4, 9, 32, 100)),
                Case(
                    "B=2, L=3, H=8, V=10, eps omitted, LayerNorm input of variance ~1e-13",
                    _heads_case(2, 3, 8, 10, eps=None, dense_scale=1e-6),
                ),
                # a LayerNorm over one unit: its output is its bias
                Case("B=3, L=2, H=1, V=5, eps=1e-5", _heads_case(3, 2, 1, 5, eps=1e-5)),
                Case("B=2, L=4, H=6, V=1", _heads_case(2, 4, 6, 1)),
            ),
        ),
        Test(
            "float32, other sizes",
            torch.float32,
            points=1,
            cases=(Case("B=5, L=12, H=24, V=64", _heads_case(5, 12, 24, 64)),),
        ),
    ),
)

LOSS = Graded(
    name="pretraining_loss",
    clause="07.pretraining_loss",
    task=5,
    signature="pretraining_loss(prediction_scores, seq_relationship_scores, masked_lm_labels, "
    "next_sentence_labels) -> scalar",
    outputs=("loss",),
    reference=ref.pretraining_loss,
    variants=(
        Variant("nsp-label-flipped", _nsp_flipped),
        Variant("mlm-loss-over-all-tokens", _mlm_over_all_positions),
    ),
    # one labelled position, then one unlabelled beside it (its -100 must not count)
    # and scores as large as the graded ones (0 * log 0, an exp that overflows)
    small=(
        _loss_case(1, 1, 2, 1.0),
        _loss_case(1, 2, 2, 0.0),
        _loss_case(2, 2, 3, 0.5),
        _loss_case(1, 1, 3, 1.0, scale=40.0),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
        Dim("V", lambda c: c.args[0].shape[2]),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=4, L=8, V=20, 15% labelled", _loss_case(4, 8, 20, 0.15)),),
        ),
        Test(
            "float64",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("B=3, L=6, V=11, 30% labelled", _loss_case(3, 6, 11, 0.3)),),
        ),
        Test(
            "float64, other shapes",
            torch.float64,
            points=1,
            cases=(
                Case("B=1, L=12, V=50, one label", _loss_case(1, 12, 50, 0.0)),
                Case("B=6, L=16, V=30, every position labelled", _loss_case(6, 16, 30, 1.0)),
                Case("B=8, L=10, V=25, large scores", _loss_case(8, 10, 25, 0.2, scale=20.0)),
                Case("B=4, L=1, V=6, every row's one position labelled", _loss_case(4, 1, 6, 1.0)),
                Case("B=3, L=5, V=1", _loss_case(3, 5, 1, 0.5)),
            ),
        ),
        Test(
            "float32, other shapes",
            torch.float32,
            points=1,
            cases=(Case("B=16, L=32, V=100, 15% labelled", _loss_case(16, 32, 100, 0.15)),),
        ),
    ),
)

SPEC = StageSpec(
    id="07_bert_pretraining",
    title="BERT pretraining: MLM and NSP data, heads and loss",
    graded=(MLM_PREDICTIONS, INSTANCES, MASK_TOKENS, HEADS, LOSS),
    call_timeout_s=20.0,  # mask_tokens is called hundreds of times per case
    misconceptions={
        "masks-special-tokens": "your output matches masking that can choose [CLS] and [SEP] (or, in "
        "mask_tokens, tokens where special_tokens_mask is True): they are never candidates, since the "
        "model sees them in every input and there is nothing to predict there.",
        "no-80-10-10": "your output matches turning every selected token into [MASK]: a selected token "
        "becomes [MASK] 80% of the time, a random word 10%, and stays 10% (in "
        "create_masked_lm_predictions: rng.random() < 0.8, else rng.random() < 0.5 keeps it, else "
        "a random vocabulary word).",
        "nsp-label-flipped": "your loss matches the NSP cross-entropy against the opposite label: label 0 "
        "means B really follows A (IsNext), 1 means B is a random sentence.",
        "mlm-loss-over-all-tokens": "your loss matches the MLM cross-entropy averaged over all B*L "
        "positions: average over the positions whose label is not -100 only "
        "(F.cross_entropy(..., ignore_index=-100) does).",
    },
)
