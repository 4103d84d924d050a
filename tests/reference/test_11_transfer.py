"""The stage 11 reference against transformers: the two heads (BertForSequenceClassification,
BertForTokenClassification) on the real all-MiniLM-L6-v2 weights and on small random
configurations, ``output_hidden_states``, N AdamW steps with Trainer's decay groups and
``get_linear_schedule_with_warmup``, and label alignment on the real tokenizer's
``word_ids()`` against the usual first-sub-token recipe. Offline; per-token outputs are
compared at real tokens only (at padding the libraries legitimately differ)."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

import reference
from autograder.runtime.drivers.bert import minilm_dir, minilm_weights
from tests.support import ROOT

os.environ["HF_HUB_OFFLINE"] = "1"  # no network, ever: the files are local
os.environ["TRANSFORMERS_OFFLINE"] = "1"

transformers = pytest.importorskip("transformers")
ref = reference.load("11_transfer")
encode = __import__("autograder.stages.09_mini_bert", fromlist=["encode"]).encode
pytestmark = pytest.mark.stage11

MINILM = ref.mini_bert.MINILM_CONFIG
SENTENCES = (
    "The film was a delight from start to finish.",
    "I would not recommend this phone to anyone.",
    "Fine.",
    ("Is the hotel near the station?", "It is a ten minute walk from the main station."),
)
# float64 agrees to rounding; float32 within 09's tolerance for six layers of real weights
TOLERANCES = [(torch.float32, dict(rtol=1e-4, atol=1e-4)), (torch.float64, dict(rtol=1e-10, atol=1e-10))]
TINY = dict(
    vocab_size=40,
    hidden_size=16,
    num_layers=2,
    num_heads=4,
    intermediate_size=24,
    max_position_embeddings=20,
    type_vocab_size=2,
    eps=1e-12,
)


def _hf_config(config: dict, num_labels: int):
    return transformers.BertConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        intermediate_size=config["intermediate_size"],
        max_position_embeddings=config["max_position_embeddings"],
        type_vocab_size=config["type_vocab_size"],
        layer_norm_eps=config["eps"],
        hidden_act="gelu",
        num_labels=num_labels,
        attn_implementation="eager",
    )


def _ours_from_hf(hf: torch.nn.Module, ours: torch.nn.Module) -> None:
    """Copy a transformers head into ours: bert.* through stage 09's name map, the pooler
    (inside bert there) beside it here, the classifier as it is."""
    state = {}
    for name, value in hf.state_dict().items():
        if name.startswith("bert.pooler."):
            state[name.removeprefix("bert.")] = value
        elif name.startswith("bert."):
            mapped = ref.mini_bert.checkpoint_name_to_ours(name)
            if mapped is not None:
                state[f"bert.{mapped}"] = value
        else:
            state[name] = value
    ours.load_state_dict(state, strict=True)


@pytest.fixture(scope="module")
def hf_heads():
    kw = dict(local_files_only=True, attn_implementation="eager", num_labels=3)
    torch.manual_seed(0)  # the classifiers are new: transformers draws them
    sequence = transformers.BertForSequenceClassification.from_pretrained(str(minilm_dir()), **kw)
    token = transformers.BertForTokenClassification.from_pretrained(str(minilm_dir()), **kw)
    return sequence.eval(), token.eval()


def _ours_pretrained(cls, hf: torch.nn.Module) -> torch.nn.Module:
    model = cls(MINILM, 3)
    ref.load_backbone(model, minilm_weights())
    with torch.no_grad():
        model.classifier.weight.copy_(hf.classifier.weight)
        model.classifier.bias.copy_(hf.classifier.bias)
    return model.eval()


def test_transformers_loads_minilms_pooler_into_the_sequence_head(hf_heads):
    sequence, token = hf_heads
    weights = minilm_weights()
    assert torch.equal(sequence.bert.pooler.dense.weight, weights["pooler.dense.weight"])
    assert token.bert.pooler is None  # BertForTokenClassification has no pooler


@pytest.mark.parametrize("dtype,tol", TOLERANCES)
def test_sequence_head_equals_transformers_on_minilm(hf_heads, dtype, tol):
    hf = hf_heads[0]
    ours = _ours_pretrained(ref.BertForSequenceClassification, hf)
    input_ids, token_type_ids, attention_mask = encode(SENTENCES)
    assert (attention_mask == 0).any() and (token_type_ids == 1).any()  # padding and a pair
    with torch.no_grad():
        want = hf.to(dtype)(input_ids, attention_mask, token_type_ids).logits
        got = ours.to(dtype)(input_ids, token_type_ids, attention_mask)
    assert got.shape == want.shape == (len(SENTENCES), 3)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype,tol", TOLERANCES)
def test_token_head_equals_transformers_on_minilm(hf_heads, dtype, tol):
    hf = hf_heads[1]
    ours = _ours_pretrained(ref.BertForTokenClassification, hf)
    input_ids, token_type_ids, attention_mask = encode(SENTENCES)
    with torch.no_grad():
        want = hf.to(dtype)(input_ids, attention_mask, token_type_ids).logits
        got = ours.to(dtype)(input_ids, token_type_ids, attention_mask)
    real = attention_mask.bool()
    assert got.shape == want.shape == (*input_ids.shape, 3)
    torch.testing.assert_close(got[real], want[real], **tol)


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_heads_equal_transformers_on_random_configurations(head):
    torch.manual_seed(11)
    hf = getattr(transformers, head)(_hf_config(TINY, 5)).eval().double()
    ours = getattr(ref, head)(TINY, 5).double()
    _ours_from_hf(hf, ours)
    input_ids = torch.randint(0, TINY["vocab_size"], (3, 9))
    token_type_ids = torch.randint(0, 2, (3, 9))
    attention_mask = (torch.arange(9)[None] < torch.tensor([[9], [4], [6]])).long()
    with torch.no_grad():
        want = hf(input_ids, attention_mask, token_type_ids).logits
        got = ours.eval()(input_ids, token_type_ids, attention_mask)
    if got.dim() == 3:
        want, got = want[attention_mask.bool()], got[attention_mask.bool()]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", TOLERANCES)
def test_hidden_states_equal_output_hidden_states_on_minilm(hf_heads, dtype, tol):
    hf = hf_heads[1].bert
    ours = ref.BertModel(**MINILM)
    ref.load_pretrained(ours, minilm_weights())
    input_ids, token_type_ids, attention_mask = encode(SENTENCES)
    with torch.no_grad():
        want = hf.to(dtype)(
            input_ids, attention_mask, token_type_ids, output_hidden_states=True
        ).hidden_states
        got = ref.hidden_states(ours.to(dtype).eval(), input_ids, token_type_ids, attention_mask)
        picked = ref.hidden_states(ours, input_ids, token_type_ids, attention_mask, layers=[-2, 0, 3, -2])
    real = attention_mask.bool()
    assert got.shape == (7, *input_ids.shape, 384) and len(want) == 7
    for i in range(7):
        torch.testing.assert_close(got[i][real], want[i][real], **tol)
    for k, i in enumerate([-2, 0, 3, -2]):
        torch.testing.assert_close(picked[k][real], want[i][real], **tol)


def test_the_last_hidden_state_is_the_models_output():
    torch.manual_seed(3)
    model = ref.BertModel(**TINY).double().eval()
    input_ids = torch.randint(0, TINY["vocab_size"], (2, 7))
    with torch.no_grad():
        states = ref.hidden_states(model, input_ids)
        assert torch.equal(states[-1], model(input_ids))
        assert torch.equal(states[0], model.embeddings(input_ids))


# -- the optimiser set-up ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "warmup,total", [(0, 10), (1, 10), (3, 10), (10, 10), (12, 10), (4, 5), (0, 0), (2, 0), (7, 100)]
)
def test_schedule_equals_transformers_at_every_step(warmup, total):
    def optimizer():
        p = torch.nn.Parameter(torch.zeros(1))
        return torch.optim.AdamW([{"params": [p], "lr": 0.5}, {"params": [], "lr": 3e-5}])

    ours, theirs = optimizer(), optimizer()
    mine = ref.linear_schedule_with_warmup(ours, warmup, total)
    hf = transformers.get_linear_schedule_with_warmup(theirs, warmup, total)
    for _ in range(total + 5):
        assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in theirs.param_groups]
        ours.step(), theirs.step()
        mine.step(), hf.step()


def _trainer_groups(model, weight_decay):
    """What transformers' Trainer.create_optimizer builds."""
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    return [
        {"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]


def test_param_groups_decay_what_transformers_trainer_decays():
    model = ref.BertForSequenceClassification(TINY, 3)
    names = {id(p): n for n, p in model.named_parameters()}
    ours = [{names[id(p)] for p in g["params"]} for g in ref.param_groups(model, 0.01)]
    theirs = [{names[id(p)] for p in g["params"]} for g in _trainer_groups(model, 0.01)]
    assert ours == theirs
    assert "bert.layers.0.norm1.weight" in ours[1] and "bert.embeddings.LayerNorm.weight" in ours[1]
    assert "bert.embeddings.word_embeddings.weight" in ours[0]
    assert all(n.endswith("bias") or "norm" in n.lower() for n in ours[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_n_adamw_steps_equal_torch_adamw_with_transformers_schedule(dtype):
    """Ours (param_groups + linear_schedule_with_warmup) against the Trainer's groups and
    transformers' schedule: the same parameters after every step, bit for bit."""
    torch.manual_seed(5)
    start = ref.BertForSequenceClassification(TINY, 3).to(dtype)
    input_ids = torch.randint(0, TINY["vocab_size"], (4, 8))
    labels = torch.tensor([0, 2, 1, 2])
    runs = []
    for ours in (True, False):
        model = ref.BertForSequenceClassification(TINY, 3).to(dtype)
        model.load_state_dict(start.state_dict())
        model.train()  # dropout on: the same seeded draws in both runs
        groups = ref.param_groups(model, 0.3) if ours else _trainer_groups(model, 0.3)
        optimizer = torch.optim.AdamW(groups, lr=0.02)
        schedule = (
            ref.linear_schedule_with_warmup if ours else transformers.get_linear_schedule_with_warmup
        )(optimizer, 3, 8)
        torch.manual_seed(6)
        trajectory = []
        for _ in range(10):  # two steps past the end of training
            loss = torch.nn.functional.cross_entropy(model(input_ids), labels)
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            trajectory.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        runs.append(trajectory)
    assert not torch.equal(runs[0][0], runs[0][-1])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


# -- label alignment on real tokenizer output ----------------------------------------------------------

NER = [
    (
        ["Arnold", "Schwarzenegger", "visited", "Hugging", "Face", "in", "Brooklyn", "."],
        [1, 2, 0, 3, 4, 0, 5, 0],
    ),
    (["Ngozi", "Okonjo-Iweala", "leads", "the", "WTO", "in", "Geneva", "."], [1, 2, 0, 0, 3, 0, 5, 0]),
    (["Müller", "signed", "for", "Bayern", "München", "in", "2013", "."], [1, 0, 0, 3, 4, 0, 0, 0]),
    (
        ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
        [3, 0, 7, 0, 0, 0, 7, 0, 0],
    ),
]


def _course_recipe(labels: list[int], word_ids: list[int | None]) -> list[int]:
    """The usual recipe (Hugging Face course, chapter 7), first sub-token only."""
    new_labels, current_word = [], None
    for word_id in word_ids:
        if word_id != current_word:
            current_word = word_id
            new_labels.append(-100 if word_id is None else labels[word_id])
        else:
            new_labels.append(-100)
    return new_labels


def test_align_labels_equals_the_word_ids_recipe_on_real_tokenizer_output():
    from tokenizers import Tokenizer

    fast = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    split = 0
    for words, labels in NER:
        encoding = fast(words, is_split_into_words=True)
        word_ids = encoding.word_ids()
        assert tok.encode(words, is_pretokenized=True).word_ids == word_ids  # the runtime's tokenizer
        got = ref.align_labels(word_ids, labels)
        assert got == _course_recipe(labels, word_ids)
        assert [lab for lab in got if lab != -100] == labels  # one label per word, in order
        split += len(word_ids) - len(words) - 2
    assert split > 3  # the sentences have words of several sub-tokens


def test_align_labels_on_padded_and_truncated_batches():
    fast = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    words = [w for w, _ in NER]
    batch = fast(words, is_split_into_words=True, padding=True, truncation=True, max_length=9)
    for i, (_, labels) in enumerate(NER):
        word_ids = batch.word_ids(i)
        assert ref.align_labels(word_ids, labels) == _course_recipe(labels, word_ids)


def test_align_labels_on_hand_made_word_ids():
    cases = [
        ([None, 0, 1, 1, 1, 2, None, None], [4, 5, 6], [-100, 4, 5, -100, -100, 6, -100, -100]),
        ([None, None], [], [-100, -100]),
        ([None, 0, None, 0, 0, None], [2], [-100, 2, -100, 2, -100, -100]),  # a pair: ids restart
    ]
    for word_ids, labels, want in cases:
        assert ref.align_labels(word_ids, labels) == want
    for n in range(1, 5):  # every grouping of sub-tokens into words of up to 4 pieces
        for pieces in itertools.product(range(1, 5), repeat=n):
            word_ids = [None] + [w for w, k in enumerate(pieces) for _ in range(k)] + [None]
            assert ref.align_labels(word_ids, list(range(n))) == _course_recipe(list(range(n)), word_ids)


# -- the drivers' AdamW ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_drivers_adamw_equals_torch_adamw_bit_for_bit(dtype):
    """The grader runs torch.optim.AdamW's update itself (drivers/transfer.py: a torch step
    imports torch._dynamo); on the probe model with decay groups and a schedule, the two
    trajectories are identical."""
    from autograder.runtime.drivers import transfer

    torch.manual_seed(8)
    sizes = dict(vocab=30, hidden=8, inner=12, layers=2, classes=3, norm_bias=False)
    start = transfer.ProbeModel(**sizes).to(dtype).state_dict()
    input_ids, labels = torch.randint(0, 30, (6, 5)), torch.randint(0, 3, (6,))
    runs = []
    for make in (transfer.AdamW, torch.optim.AdamW):
        model = transfer.ProbeModel(**sizes).to(dtype)
        model.load_state_dict(start)
        optimizer = make(ref.param_groups(model, 0.4), lr=0.05, betas=(0.8, 0.99), eps=1e-6)
        schedule = ref.linear_schedule_with_warmup(optimizer, 2, 6)
        for _ in range(8):
            torch.nn.functional.cross_entropy(model(input_ids), labels).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], torch.cat([p.flatten() for p in start.values()]))


def test_grading_an_optimiser_imports_no_dynamo():
    """A grading child does not pay torch._dynamo's import (1-2 s) for stage 11's drivers."""
    import subprocess
    import sys

    code = (
        "import sys, torch, reference\n"
        "from autograder.stages import load_spec\n"
        "from autograder.stages.spec import build_case\n"
        "from autograder.grader.plan import run_trusted\n"
        "spec = load_spec('11_transfer')\n"
        "for name in ('param_groups', 'linear_schedule_with_warmup'):\n"
        "    g = spec.graded_name(name)\n"
        "    run_trusted(g.reference, g, build_case(spec, g, g.tests[0], g.tests[0].cases[0]), 'cpu', spec)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
