"""The stage 07 reference against code nobody here wrote: the original BERT release's
create_pretraining_data.py (PyPI bert-tensorflow 1.0.4, module bert.create_pretraining_data)
bit for bit, rng state included, and transformers' BertForPreTraining heads and loss. Then
the stage's own promises: the spec's expected values are the original script's, the
statistical grading of mask_tokens passes correct programs that draw differently, and its
bounds hold."""

from __future__ import annotations

import copy
import inspect
import math
import random
import sys
import types
import warnings

import pytest
import torch
from torch import nn

import reference
from autograder.grader.plan import run_trusted
from autograder.runtime.compare import compare
from autograder.runtime.drivers import pretraining as drivers
from autograder.runtime.drivers.bert import minilm_dir
from autograder.stages import load_spec
from autograder.stages.spec import CaseData, build_case, tolerance_for

ref = reference.load("07_bert_pretraining")
SPEC = load_spec("07_bert_pretraining")
pytestmark = pytest.mark.stage07


# -- the oracle: the original script, with a stub for the tensorflow it imports --------------


@pytest.fixture(scope="module")
def oracle():
    """bert.create_pretraining_data and bert.tokenization, imported over a stub `tensorflow`
    (they use it only for flags, logging and file I/O). Every module the import added,
    the stub included, leaves sys.modules at once (the functions keep their globals), so
    nothing else (transformers, torch._dynamo) ever sees the stub."""
    from absl import flags, logging

    before = set(sys.modules)
    tf = types.ModuleType("tensorflow")
    tf.flags = flags
    tf.logging = logging
    tf.gfile = types.SimpleNamespace(GFile=open, Glob=lambda pattern: [pattern])
    tf.app = types.SimpleNamespace(run=lambda main=None: None)
    compat = types.ModuleType("tensorflow.compat")
    compat.v1 = tf
    tf.compat = compat
    sys.modules.update({"tensorflow": tf, "tensorflow.compat": compat, "tensorflow.compat.v1": tf})
    try:
        import bert.create_pretraining_data as cpd
        import bert.tokenization as tokenization
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
    assert "tensorflow" not in sys.modules and "bert.create_pretraining_data" not in sys.modules
    # its one flag, unparsed in a test process (the module object is private to this fixture)
    tokenization.FLAGS = types.SimpleNamespace(preserve_unused_tokens=False)
    return types.SimpleNamespace(cpd=cpd, tokenization=tokenization)


def _spec_module():
    return sys.modules[f"autograder.stages.{SPEC.id}"]


@pytest.fixture(scope="module")
def vocab_words(oracle):
    return list(oracle.tokenization.load_vocab(str(minilm_dir() / "vocab.txt")).keys())


def test_the_oracle_is_the_per_wordpiece_release(oracle):
    # 1.0.4 predates whole-word masking: one candidate per WordPiece, no flag to turn off
    assert "do_whole_word_mask" not in oracle.cpd.FLAGS
    import inspect

    sig = inspect.signature(oracle.cpd.create_masked_lm_predictions)
    assert list(sig.parameters) == [
        "tokens",
        "masked_lm_prob",
        "max_predictions_per_seq",
        "vocab_words",
        "rng",
    ]


def test_real_vocabulary_and_wordpieces_are_the_originals(oracle, vocab_words):
    assert list(drivers.real_vocab()) == vocab_words
    assert len(vocab_words) == 30522 and vocab_words[103] == "[MASK]"
    tokenizer = oracle.tokenization.FullTokenizer(str(minilm_dir() / "vocab.txt"), do_lower_case=True)
    lines = [x for x in _spec_module().CORPUS.read_text(encoding="utf-8").splitlines() if x.strip()]
    for line in lines:
        assert _spec_module().wordpieces(line) == tokenizer.tokenize(line), line
    docs = _spec_module().corpus_documents()
    assert len(docs) >= 30 and sum(len(d) for d in docs) == len(lines)


# -- create_masked_lm_predictions, bit for bit -------------------------------------------------


def _token_lists(vocab_words):
    rng = random.Random(7)
    small = [f"w{i}" for i in range(30)]
    out = []
    for len_a, len_b in ((1, 1), (2, 5), (10, 10), (40, 3), (60, 70), (200, 300)):
        out.append(
            (["[CLS]", *rng.choices(small, k=len_a), "[SEP]", *rng.choices(small, k=len_b), "[SEP]"], small)
        )
    for doc in _spec_module().corpus_documents()[:8]:
        pieces = [t for s in doc for t in s]
        out.append((["[CLS]", *pieces[:10], "[SEP]", *pieces[10:], "[SEP]"], vocab_words))
    out.append((["[CLS]", "[SEP]", "a", "[SEP]"], small))  # one candidate
    return out


@pytest.mark.parametrize("prob,cap", [(0.15, 20), (0.3, 5), (0.5, 100), (0.01, 20), (1.0, 1000)])
def test_masked_lm_predictions_equal_the_original(oracle, vocab_words, prob, cap):
    for tokens, vocab in _token_lists(vocab_words):
        for seed in range(40):
            mine, theirs = random.Random(seed), random.Random(seed)
            original = list(tokens)
            got = ref.create_masked_lm_predictions(tokens, vocab, mine, prob, cap)
            want = oracle.cpd.create_masked_lm_predictions(list(tokens), prob, cap, vocab, theirs)
            assert got == tuple(want)
            assert mine.getstate() == theirs.getstate()
            assert tokens == original  # the input is not changed


def test_masked_lm_defaults(oracle):
    tokens = ["[CLS]", *(f"w{i}" for i in range(150)), "[SEP]"]
    got = ref.create_masked_lm_predictions(tokens, ["x", "y"], random.Random(3))
    assert got == tuple(
        oracle.cpd.create_masked_lm_predictions(tokens, 0.15, 20, ["x", "y"], random.Random(3))
    )
    assert len(got[1]) == 20 and got[1] == sorted(got[1])


# -- create_instances_from_document, bit for bit -------------------------------------------------


def _synthetic_corpus(seed, n_docs, segments, length):
    rng = random.Random(seed)
    return [
        [
            [f"w{rng.randrange(50)}" for _ in range(rng.randint(*length))]
            for _ in range(rng.randint(*segments))
        ]
        for _ in range(n_docs)
    ]


def _fields(inst):
    return (
        inst.tokens,
        inst.segment_ids,
        inst.is_random_next,
        inst.masked_lm_positions,
        inst.masked_lm_labels,
    )


def _compare_instances(oracle, docs, index, max_len, short, prob, cap, vocab, seed):
    mine, theirs = random.Random(seed), random.Random(seed)
    got = ref.create_instances_from_document(
        copy.deepcopy(docs), index, max_len, short, prob, cap, vocab, mine
    )
    want = oracle.cpd.create_instances_from_document(
        copy.deepcopy(docs), index, max_len, short, prob, cap, vocab, theirs
    )
    assert [_fields(i) for i in got] == [_fields(i) for i in want], (index, max_len, short, seed)
    assert mine.getstate() == theirs.getstate()
    return got


@pytest.mark.parametrize("max_len", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("short", [0.0, 0.1, 1.0])
def test_instances_on_the_real_corpus_equal_the_original(oracle, vocab_words, max_len, short):
    docs = [[list(s) for s in d] for d in _spec_module().corpus_documents()]
    for index in range(len(docs)):
        for seed in range(3):
            _compare_instances(
                oracle, docs, index, max_len, short, 0.15, 20, vocab_words, 1000 * index + seed
            )


@pytest.mark.parametrize(
    "n_docs,segments,length",
    [
        (1, (5, 12), (2, 8)),
        (1, (1, 1), (3, 9)),
        (2, (1, 3), (1, 4)),
        (6, (20, 60), (5, 40)),
        (10, (1, 1), (2, 30)),
    ],
    ids=[
        "single document",
        "single one-segment document",
        "two tiny",
        "long documents",
        "one-segment documents",
    ],
)
def test_instances_on_synthetic_corpora_equal_the_original(oracle, n_docs, segments, length):
    vocab = [f"w{i}" for i in range(50)] + ["[MASK]"]
    n = 0
    for seed in range(12):
        docs = _synthetic_corpus(seed, n_docs, segments, length)
        for max_len, short, prob, cap in (
            (8, 0.1, 0.15, 20),
            (24, 1.0, 0.3, 4),
            (128, 0.0, 0.15, 20),
            (5, 0.5, 0.5, 3),
        ):
            for index in range(n_docs):
                n += len(_compare_instances(oracle, docs, index, max_len, short, prob, cap, vocab, seed))
    assert n > 0


def test_single_document_corpus_takes_its_random_next_from_itself(oracle):
    # with one document, the 10 tries never find another: B comes from the same document
    docs = _synthetic_corpus(0, 1, (1, 1), (6, 6))
    got = _compare_instances(oracle, docs, 0, 32, 0.0, 0.15, 20, ["x"], 5)
    assert len(got) == 1 and got[0].is_random_next


# -- the spec's expected values are the original's ---------------------------------------------


def _oracle_namespace(oracle):
    def create_masked_lm_predictions(
        tokens, vocab_words, rng, masked_lm_prob=0.15, max_predictions_per_seq=20
    ):
        return oracle.cpd.create_masked_lm_predictions(
            tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng
        )

    return {
        "create_masked_lm_predictions": create_masked_lm_predictions,
        "create_instances_from_document": oracle.cpd.create_instances_from_document,
    }


@pytest.mark.parametrize("name", ["create_masked_lm_predictions", "create_instances_from_document"])
def test_spec_expectations_are_the_originals(oracle, name):
    graded = SPEC.graded_name(name)
    ns = _oracle_namespace(oracle)
    driver = drivers.masked_lm if name == "create_masked_lm_predictions" else drivers.instances
    for test in graded.tests:
        for case in test.cases:
            data = build_case(SPEC, graded, test, case)
            expected = run_trusted(graded.reference, graded, data, "cpu", SPEC)
            got = driver(ns, {"kwargs": dict(data.kwargs)}, "cpu")
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), case.label
            assert all(v.min() >= 0 for v in expected[:-1] if v.numel()), "every token is in the vocabulary"


# -- mask_tokens -------------------------------------------------------------------------------


def _collator_style(
    input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, mlm_probability=0.15
):
    """transformers' DataCollatorForLanguageModeling.torch_mask_tokens, with the generator:
    correct, but its draws are not the reference's."""
    labels = input_ids.clone()
    probability = torch.full(labels.shape, mlm_probability, device=input_ids.device)
    probability.masked_fill_(special_tokens_mask, 0.0)
    masked = torch.bernoulli(probability, generator=generator).bool()
    labels[~masked] = -100
    replaced = torch.bernoulli(
        torch.full(labels.shape, 0.8, device=input_ids.device), generator=generator
    ).bool()
    replaced &= masked
    input_ids[replaced] = mask_token_id
    randomised = torch.bernoulli(
        torch.full(labels.shape, 0.5, device=input_ids.device), generator=generator
    ).bool()
    randomised &= masked & ~replaced
    words = torch.randint(vocab_size, labels.shape, generator=generator, device=input_ids.device)
    input_ids[randomised] = words[randomised]
    return input_ids, labels


def _loop_style(input_ids, special_tokens_mask, vocab_size, mask_token_id, generator, mlm_probability=0.15):
    """One token at a time with torch.rand scalars: correct, slow, drawn in another order."""
    out, labels = input_ids.clone(), torch.full_like(input_ids, -100)
    u = torch.rand((*input_ids.shape, 3), generator=generator, device=input_ids.device).tolist()
    for i in range(input_ids.size(0)):
        for j in range(input_ids.size(1)):
            if special_tokens_mask[i, j] or u[i][j][0] >= mlm_probability:
                continue
            labels[i, j] = input_ids[i, j]
            if u[i][j][1] < 0.8:
                out[i, j] = mask_token_id
            elif u[i][j][1] < 0.9:
                out[i, j] = int(u[i][j][2] * vocab_size)
    return out, labels


def _mask_cases():
    graded = SPEC.graded_name("mask_tokens")
    return graded, [
        (case.label, build_case(SPEC, graded, test, case)) for test in graded.tests for case in test.cases
    ]


def test_reference_rates_lie_within_their_bounds_of_the_contract():
    graded, cases = _mask_cases()
    for label, data in cases:
        kw = data.kwargs
        p, vocab = kw.get("mlm_probability", 0.15), kw["vocab_size"]
        selected, to_mask, to_random, kept, *flags = run_trusted(graded.reference, graded, data, "cpu", SPEC)
        t_select, t_fraction = _spec_module().rate_bounds(data)
        assert abs(float(selected) - p) <= t_select, label
        # exact means: a random id may be the original or the mask id, 1/V each
        assert abs(float(to_mask) - (0.8 + 0.1 / vocab)) <= t_fraction, label
        assert abs(float(kept) - (0.1 + 0.1 / vocab)) <= t_fraction, label
        assert abs(float(to_random) - 0.1 * (1 - 2 / vocab)) <= t_fraction, label
        assert [int(f) for f in flags] == [1, 1, 1]


def test_false_fail_probability_is_below_one_in_a_million_per_test():
    graded, _ = _mask_cases()
    delta = _spec_module().DELTA
    for test in graded.tests:
        # four rates per case, each outside its bound with probability <= DELTA (Hoeffding)
        assert 4 * delta * len(test.cases) < 1e-6
    for _label, data in _mask_cases()[1]:
        t_select, t_fraction = _spec_module().rate_bounds(data)
        n = data.kwargs["repeats"] * int((~data.kwargs["special_tokens_mask"]).sum())
        assert 2 * math.exp(-2 * n * t_select**2) <= delta * (1 + 1e-9)
        # and the bound is tight enough to tell 10% from 0% (no random words, or none kept)
        assert 2 * max(t_select, t_fraction) < 0.05


def _passes(impl, data: CaseData) -> tuple[bool, str]:
    """Does ``impl`` pass the case ``data`` against the reference, as the grader checks it?"""
    graded = SPEC.graded_name("mask_tokens")
    want = run_trusted(graded.reference, graded, data, "cpu", SPEC)
    got = drivers.mask_statistics({"mask_tokens": impl}, {"kwargs": dict(data.kwargs)}, "cpu")
    tol = graded.tolerance(data, torch.int64, "cpu")
    results = [compare(a, b, tol) for a, b in zip(got, want, strict=True)]
    return all(r.ok for r in results), "; ".join(r.message for r in results)


def test_correct_mask_tokens_drawn_differently_pass_the_spec_cases():
    for label, data in _mask_cases()[1]:
        ok, message = _passes(_collator_style, data)
        assert ok, (label, message)


@pytest.mark.parametrize("seed", range(3))
def test_correct_mask_tokens_drawn_differently_pass_other_seeds(seed):
    g = torch.Generator().manual_seed(seed)
    small = _spec_module()._mask_case((8, 40), 1000, 4, 300, mlm_probability=0.2)(g, torch.int64)
    for impl in (_collator_style, _loop_style):
        ok, message = _passes(impl, small)
        assert ok, (impl.__name__, message)


def test_mask_tokens_properties():
    ids, special = _spec_module()._real_batch(8, 40)
    for seed in range(20):
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        torch.manual_seed(seed + 100)
        a = ref.mask_tokens(ids.clone(), special, 30522, 103, g1)
        torch.manual_seed(seed + 200)
        b = ref.mask_tokens(ids.clone(), special, 30522, 103, g2)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        out, labels = a
        assert labels.dtype == torch.int64
        assert torch.equal(out[special], ids[special]) and (labels[special] == -100).all()
        chosen = labels != -100
        assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(out[~chosen], ids[~chosen])


# -- heads and loss: transformers' BertForPreTraining -----------------------------------------


def _tiny_pretraining_model(dtype):
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(
        vocab_size=37,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=20,
        layer_norm_eps=1e-12,
        hidden_act="gelu",
    )
    torch.manual_seed(0)
    model = BertForPreTraining(config).to(dtype).eval()
    with torch.no_grad():  # non-trivial values where transformers initialises zeros and ones
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _heads_from(model):
    emb = model.bert.embeddings.word_embeddings
    config = model.config
    heads = ref.BertPretrainingHeads(config.hidden_size, config.vocab_size, emb, config.layer_norm_eps)
    heads.to(emb.weight.dtype)
    cls = model.cls
    with torch.no_grad():
        heads.dense.load_state_dict(cls.predictions.transform.dense.state_dict())
        heads.layer_norm.load_state_dict(cls.predictions.transform.LayerNorm.state_dict())
        heads.bias.copy_(cls.predictions.bias)
        heads.pooler.load_state_dict(model.bert.pooler.dense.state_dict())
        heads.seq_relationship.load_state_dict(cls.seq_relationship.state_dict())
    return heads.eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_heads_and_loss_equal_bert_for_pretraining(dtype):
    model = _tiny_pretraining_model(dtype)
    heads = _heads_from(model)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 37, (4, 11), generator=g)
    labels = torch.where(torch.rand(4, 11, generator=g) < 0.3, input_ids, torch.full_like(input_ids, -100))
    labels[:, 1] = input_ids[:, 1]
    nsp = torch.tensor([0, 1, 1, 0])
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        out = model(input_ids, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
        scores, nsp_scores = heads(out.hidden_states[-1])
        torch.testing.assert_close(scores, out.prediction_logits, **tol)
        torch.testing.assert_close(nsp_scores, out.seq_relationship_logits, **tol)
        loss = ref.pretraining_loss(scores, nsp_scores, labels, nsp)
        torch.testing.assert_close(loss, out.loss, **tol)
        # NSP label 0 = IsNext: the flipped labels give another loss
        assert not torch.isclose(ref.pretraining_loss(scores, nsp_scores, labels, 1 - nsp), out.loss)


def test_decoder_is_tied_to_the_embeddings():
    emb = nn.Embedding(13, 8)
    heads = ref.BertPretrainingHeads(8, 13, emb)
    assert heads.decoder.weight is emb.weight
    assert heads.decoder.bias is None and heads.bias.shape == (13,)
    x = torch.randn(2, 3, 8)
    before = heads(x)[0]
    with torch.no_grad():
        emb.weight.mul_(2.0)  # a change of the embeddings is a change of the decoder
    assert not torch.allclose(heads(x)[0], before)
    # one optimiser step moves the single shared tensor once, through both uses
    heads(x)[0].sum().backward()
    assert emb.weight.grad is not None and heads.decoder.weight.grad is emb.weight.grad


def test_heads_driver_reports_a_copied_decoder():
    class Copied(ref.BertPretrainingHeads):
        def __init__(self, hidden_size, vocab_size, word_embeddings, eps=1e-12):
            super().__init__(hidden_size, vocab_size, word_embeddings, eps)
            self.decoder.weight = nn.Parameter(word_embeddings.weight.detach().clone())

    graded = SPEC.graded_name("BertPretrainingHeads")
    test = graded.tests[0]
    data = build_case(SPEC, graded, test, test.cases[0])
    want = run_trusted(graded.reference, graded, data, "cpu", SPEC)
    got = run_trusted(Copied, graded, data, "cpu", SPEC)
    assert int(want[2]) == 1 and int(got[2]) == 0
    torch.testing.assert_close(got[0], want[0])  # same numbers, but not tied


# -- what the hidden cases decide (issue 17) ---------------------------------------------------
#
# Each mistake below passes every case where the thing it gets wrong does not come up: a draw
# exactly on its threshold, a count exactly on .5, an index past 256, a default that binds, a
# bound whose bit length changes what randint draws. Some hidden case of its graded name must
# fail it. `make mutation` grades such mistakes through the whole grader; this checks in
# seconds that an edit to a case does not stop it deciding one.

MISTAKES = [
    # (graded name, the reference's code, the mistake)
    (
        "create_masked_lm_predictions",
        "max_predictions_per_seq: int = 20",
        "max_predictions_per_seq: int = 21",
    ),
    (
        "create_masked_lm_predictions",
        "max_predictions_per_seq: int = 20",
        "max_predictions_per_seq: int = 19",
    ),
    (
        "create_masked_lm_predictions",
        "int(round(len(tokens) * masked_lm_prob))",
        "int(len(tokens) * masked_lm_prob + 0.5)",
    ),
    ("create_masked_lm_predictions", "max(1, int(", "max(0, int("),
    ("create_masked_lm_predictions", "len(vocab_words) - 1)", "len(vocab_words))"),
    ("create_masked_lm_predictions", "rng.random() < 0.8", "rng.random() <= 0.8"),
    ("create_masked_lm_predictions", "elif rng.random() < 0.5", "elif rng.random() <= 0.5"),
    (
        "create_instances_from_document",
        "rng.randint(2, max_num_tokens)",
        "rng.randint(2, max_num_tokens + 1)",
    ),
    (
        "create_instances_from_document",
        "rng.randint(2, max_num_tokens)",
        "rng.randint(2, max_num_tokens - 1)",
    ),
    ("create_instances_from_document", "rng.random() < short_seq_prob", "rng.random() <= short_seq_prob"),
    ("create_instances_from_document", "or rng.random() < 0.5", "or rng.random() <= 0.5"),
    ("create_instances_from_document", "or rng.random() < 0.5", "or rng.random() < 0.55"),
    (
        "create_instances_from_document",
        "if rng.random() < 0.5:\n            del",
        "if rng.random() <= 0.5:\n            del",
    ),
    ("create_instances_from_document", "len(tokens_b) >= target_b_length", "len(tokens_b) > target_b_length"),
    ("create_instances_from_document", "chunk_length = 0\n    i = 0", "chunk_length = -1\n    i = 0"),
    ("create_instances_from_document", "if i == len(document) - 1", "if i is len(document) - 1"),
    ("create_instances_from_document", "while i < len(document)", "while i is not len(document)"),
    (
        "create_instances_from_document",
        "random_index != document_index",
        "random_index is not document_index",
    ),
    ("mask_tokens", "vocab_size, input_ids.shape", "vocab_size + 1, input_ids.shape"),
    ("mask_tokens", "vocab_size, input_ids.shape", "vocab_size - 1, input_ids.shape"),
    ("BertPretrainingHeads", "eps: float = 1e-12", "eps: float = 0.0"),
    ("BertPretrainingHeads", "eps: float = 1e-12", "eps: float = 1e-05"),
]


def _reference_with(code: str, mistake: str) -> dict:
    """The reference's names, compiled with ``code`` replaced by ``mistake``."""
    source = inspect.getsource(ref)
    assert source.count(code) == 1, f"the reference no longer holds {code!r} once"
    module = types.ModuleType("reference_with_a_mistake")
    sys.modules[module.__name__] = module  # dataclass looks the class's module up
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # `is` with an int
            exec(compile(source.replace(code, mistake), "<mistake>", "exec"), vars(module))
    finally:
        del sys.modules[module.__name__]
    return vars(module)


def _fails(graded, fn, test, data) -> bool:
    want = run_trusted(graded.reference, graded, data, "cpu", SPEC)
    try:
        got = run_trusted(fn, graded, data, "cpu", SPEC)
    except Exception:  # an index past the vocabulary, a loop past the document
        return True
    tol = graded.tolerance(data, test.dtype, "cpu") if graded.tolerance else tolerance_for(test.dtype)
    return not all(compare(a, b, tol).ok for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize(("name", "code", "mistake"), MISTAKES, ids=[m[2] for m in MISTAKES])
def test_a_hidden_case_fails_the_mistake(name, code, mistake):
    graded = SPEC.graded_name(name)
    fn = _reference_with(code, mistake)[name]
    hidden = [(t, build_case(SPEC, graded, t, c)) for t in graded.tests if t.hidden for c in t.cases]
    assert any(_fails(graded, fn, t, data) for t, data in hidden)


def test_landed_rng_states_are_the_seeded_outputs_but_for_the_landed_draws():
    for name in ("create_masked_lm_predictions", "create_instances_from_document"):
        graded = SPEC.graded_name(name)
        landed = [build_case(SPEC, graded, t, c).kwargs for t in graded.tests for c in t.cases]
        landed = [kw for kw in landed if "rng_state" in kw]
        assert landed, name
        for kw in landed:
            seeded, crafted = random.Random(kw["seed"]), random.Random()
            crafted.setstate((3, tuple(kw["rng_state"]), None))
            words = [(seeded.getrandbits(32), crafted.getrandbits(32)) for _ in range(624)]
            changed = sum(a != b for a, b in words)
            assert 0 < changed <= 2 * 3  # two words per landed draw, at most three draws


def test_every_optional_parameter_is_left_out_by_a_case_and_moved_by_another():
    # the drivers' protocols: options passed in order, mlm_probability and eps only when given
    def cases(name):
        graded = SPEC.graded_name(name)
        return [build_case(SPEC, graded, t, c).kwargs for t in graded.tests for c in t.cases]

    options = [kw["options"] for kw in cases("create_masked_lm_predictions")]
    for i, default in enumerate((0.15, 20)):
        assert any(len(o) <= i for o in options) and any(len(o) > i and o[i] != default for o in options)
    for name, parameter, default in (
        ("mask_tokens", "mlm_probability", 0.15),
        ("BertPretrainingHeads", "eps", 1e-12),
    ):
        given = [kw[parameter] for kw in cases(name) if parameter in kw]
        assert len(given) < len(cases(name)) and any(v != default for v in given), parameter
