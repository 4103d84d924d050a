"""Stage 09: a BERT from the student's own parts, on real pretrained weights
(CURRICULUM.md, 09_mini_bert).

Three graded names: ``BertEmbeddings`` and ``BertModel`` on small random configurations
(structure, masks, token types), and ``load_pretrained``, graded by the ``bert:pretrained``
driver: the student's BertModel with the real all-MiniLM-L6-v2 weights loaded by the
student's own ``load_pretrained``, on real sentences, against the reference's hidden
states (computed once per grading run). Only positions where ``attention_mask == 1`` are
graded: what a model computes at padding is never used.
"""

from __future__ import annotations

import torch
from torch import Tensor

import reference
from autograder.runtime.drivers.bert import minilm_tokenizer
from autograder.stages import load_spec
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Tolerance,
    Variant,
    randint,
    randn,
    tolerance_for,
)

ref = reference.load("09_mini_bert")

# Building BERT out of torch's own attention or encoder layer is not building it from the
# student's parts (CURRICULUM.md, 09.BertModel). 09 runs the student's 06 layer, so it
# forbids exactly what that layer forbids and nothing it allows: the library GELU
# (allowed in 06's feed-forward network), softmax (allowed in 01's attention), LayerNorm.
FORBIDDEN = load_spec("06_transformer_block").graded_name("TransformerEncoderLayer").forbidden

# -- small random configurations ------------------------------------------------------------

TINY = dict(
    vocab_size=50,
    hidden_size=16,
    num_layers=2,
    num_heads=4,
    intermediate_size=32,
    max_position_embeddings=24,
    type_vocab_size=2,
    eps=1e-12,
)
EMBEDDING_KEYS = ("vocab_size", "hidden_size", "max_position_embeddings", "type_vocab_size", "eps")


def _random_state(module: torch.nn.Module, g: torch.Generator, dtype: torch.dtype) -> dict[str, Tensor]:
    """Random values for every entry of ``module``'s state dict (LayerNorm gains near 1)."""
    state = {}
    for name, value in sorted(module.state_dict().items()):
        t = randn(g, *value.shape, dtype=dtype, scale=0.5)
        if "LayerNorm.weight" in name or "norm1.weight" in name or "norm2.weight" in name:
            t = t * 0.2 + 1.0
        state[name] = t
    return state


def _batch(g: torch.Generator, b: int, length: int, vocab: int, padded: bool, types: bool):
    input_ids = randint(g, 0, vocab, b, length)  # (B, L)
    token_type_ids = randint(g, 0, 2, b, length) if types else None
    attention_mask = None
    if padded:
        lengths = randint(g, 2, length + 1, b)  # at least two real tokens
        lengths[0] = length  # one full row
        attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()  # (B, L) 1 = real
    return input_ids, token_type_ids, attention_mask


def _constant_sum(state: dict[str, Tensor], prefix: str, input_ids: Tensor, token_type_ids: Tensor | None):
    """Make the embeddings of the token at (0, 1) sum to 0.5 in every hidden unit: its LayerNorm
    input has variance exactly 0, where only eps keeps 0 / sqrt(var + eps) from being NaN. The
    position and type rows are rounded to multiples of 1/64 (they still vary), so the word row
    0.5 - position - type, and every order of adding the three, is exact in float32 and float64."""
    word, kind = int(input_ids[0, 1]), 0 if token_type_ids is None else int(token_type_ids[0, 1])
    position = state[f"{prefix}position_embeddings.weight"]
    token_type = state[f"{prefix}token_type_embeddings.weight"]
    position[1] = torch.round(position[1] * 64) / 64
    token_type[kind] = torch.round(token_type[kind] * 64) / 64
    state[f"{prefix}word_embeddings.weight"][word] = 0.5 - position[1] - token_type[kind]


def _config(keys, eps: float | None, overrides: dict) -> dict:
    """The constructor's arguments; ``eps=None`` leaves eps out, so its default is what is graded."""
    config = {**{k: TINY[k] for k in keys if k != "eps"}, **overrides}
    return config if eps is None else {**config, "eps": eps}


def _embeddings_case(
    b: int,
    length: int,
    types: bool,
    eps: float | None = TINY["eps"],
    constant_token: bool = False,
    omit_none: bool = False,
    **overrides: int,
):
    """``omit_none``: no token types is ``forward(input_ids)`` (the default), not ``(input_ids, None)``.
    ``constant_token``: see ``_constant_sum``. ``overrides``: other sizes than TINY's."""

    def build(g, dtype):
        config = _config(EMBEDDING_KEYS, eps, overrides)
        state = _random_state(ref.BertEmbeddings(**config), g, dtype)
        input_ids, token_type_ids, _ = _batch(g, b, length, config["vocab_size"], False, types)
        if constant_token:
            _constant_sum(state, "", input_ids, token_type_ids)
        args = (input_ids,) if omit_none and token_type_ids is None else (input_ids, token_type_ids)
        return CaseData(args=args, init_kwargs=config, state=state)

    return build


def _model_case(
    b: int,
    length: int,
    padded: bool,
    types: bool,
    eps: float | None = TINY["eps"],
    constant_token: bool = False,
    omit_none: bool = False,
    **overrides: int,
):
    """``omit_none``: token types or a mask that the case has none of are left out of the call
    (the defaults), not passed as None. ``constant_token``: see ``_constant_sum``."""

    def build(g, dtype):
        config = _config(tuple(TINY), eps, overrides)
        state = _random_state(ref.BertModel(**config), g, dtype)
        input_ids, token_type_ids, attention_mask = _batch(g, b, length, config["vocab_size"], padded, types)
        if constant_token:
            _constant_sum(state, "embeddings.", input_ids, token_type_ids)
        kwargs = {"token_type_ids": token_type_ids, "attention_mask": attention_mask}
        if omit_none:
            kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs=config, state=state)

    return build


# The smallest configurations counterexamples are tried on (``Graded.small``): a hidden size of
# 3 (a LayerNorm over 2 values keeps only the sign of their difference, which hides most
# mistakes), and two of what the mistakes need (word ids, positions, token types).
SMALL_EMBEDDINGS = dict(vocab_size=2, hidden_size=3, max_position_embeddings=2, type_vocab_size=2)
SMALL_MODEL = dict(
    SMALL_EMBEDDINGS, num_layers=1, num_heads=1, intermediate_size=1, max_position_embeddings=3
)


# The sizes of a configuration, each 1 in some case: a BERT of one word, one feature (its
# LayerNorms then return their biases), one layer, head, position and token type is
# degenerate, and allowed.
def _size(key: str) -> Dim:
    return Dim(key, lambda c: c.init_kwargs[key])


def _batch_dims(ids) -> tuple[Dim, ...]:
    """B and L of the input ids, ``ids(case data)``."""
    return (Dim("B", lambda c: ids(c).shape[0]), Dim("L", lambda c: ids(c).shape[1]))


ALL_ONE = dict(
    vocab_size=1,
    hidden_size=1,
    num_layers=1,
    num_heads=1,
    intermediate_size=1,
    max_position_embeddings=1,
    type_vocab_size=1,
)


def _real_positions(mask: Tensor | None) -> tuple[Tensor | None]:
    return (None if mask is None else mask.bool()[..., None],)  # (B, L, 1)


# -- known mistakes -------------------------------------------------------------------------


class _EmbeddingsWithoutLayerNorm(ref.BertEmbeddings):
    def forward(self, input_ids, token_type_ids=None):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )


class _ModelWithoutEmbeddingLayerNorm(ref.BertModel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embeddings.__class__ = _EmbeddingsWithoutLayerNorm


class _ModelIgnoringMask(ref.BertModel):
    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        return super().forward(input_ids, token_type_ids, None)


def _load_with_norms_swapped(model, weights):
    swapped = {}
    for name, value in weights.items():
        if ".attention.output.LayerNorm." in name:
            name = name.replace(".attention.output.LayerNorm.", ".output.LayerNorm.")
        elif ".output.LayerNorm." in name:
            name = name.replace(".output.LayerNorm.", ".attention.output.LayerNorm.")
        swapped[name] = value
    ref.load_pretrained(model, swapped)


# -- real sentences ---------------------------------------------------------------------------

PUBLIC_SENTENCES = (
    "The cat sat on the mat.",
    "Attention is all you need.",
    "BERT reads a sentence in both directions at once.",
)
HIDDEN_SENTENCES = (
    "She deposited the cheque at the bank before noon.",
    "Transformers replaced recurrence with self-attention.",
    "A quick brown fox jumps over the lazy dog.",
    "Positional information is learned rather than fixed.",
)
HIDDEN_PAIR = ("Where did the river flood?", "The river flooded the fields near the old mill.")


def encode(sentences: tuple[str | tuple[str, str], ...]) -> tuple[Tensor, Tensor, Tensor]:
    """Real WordPiece ids, padded with [PAD] (id 0): input_ids, token_type_ids,
    attention_mask, each (B, L) int64."""
    tok = minilm_tokenizer()
    encodings = [tok.encode(*s) if isinstance(s, tuple) else tok.encode(s) for s in sentences]
    length = max(len(e.ids) for e in encodings)
    out = torch.zeros(3, len(encodings), length, dtype=torch.int64)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        out[0, i, :n] = torch.tensor(e.ids)
        out[1, i, :n] = torch.tensor(e.type_ids)
        out[2, i, :n] = 1
    return out[0], out[1], out[2]


def _pretrained_case(sentences, pad: int = 0):
    """``pad``: that many [PAD] positions more at the end of every row (a row of one sentence
    padded, as in a batch of longer ones)."""

    def build(g, dtype):
        input_ids, token_type_ids, attention_mask = (
            torch.nn.functional.pad(t, (0, pad)) for t in encode(sentences)
        )
        return CaseData(
            args=(input_ids, token_type_ids, attention_mask),
            kwargs={"dtype": str(dtype).removeprefix("torch.")},
            init_kwargs=ref.MINILM_CONFIG,
        )

    return build


def _pretrained_tolerance(data: CaseData, dtype: torch.dtype, device: str) -> Tolerance:
    # Six layers of real weights: two correct programs that order their sums differently
    # drift by ~1e-5 in float32 on hidden states of magnitude ~1-10; a mistake moves them by
    # 1e-1 or more (tests/test_stages.py proves both sides).
    if dtype == torch.float32:
        return Tolerance(rtol=1e-4, atol=2e-4 if device.startswith("cuda") else 1e-4)
    return tolerance_for(dtype, device)


# -- graded names -----------------------------------------------------------------------------

EMBEDDINGS = Graded(
    name="BertEmbeddings",
    clause="09.BertEmbeddings",
    task=1,
    signature="BertEmbeddings(vocab_size, hidden_size, max_position_embeddings, type_vocab_size, "
    "eps=1e-12); forward(input_ids, token_type_ids=None) -> (B, L, hidden_size)",
    outputs=("embeddings",),
    reference=ref.BertEmbeddings,
    kind="module",
    variants=(Variant("no-embedding-layernorm", _EmbeddingsWithoutLayerNorm),),
    dims=(*_batch_dims(lambda c: c.args[0]), *(_size(k) for k in EMBEDDING_KEYS if k != "eps")),
    small=(
        _embeddings_case(1, 1, False, **SMALL_EMBEDDINGS),
        _embeddings_case(1, 2, True, **SMALL_EMBEDDINGS),
        _embeddings_case(2, 2, True, **SMALL_EMBEDDINGS),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, L=7, token types", _embeddings_case(2, 7, True)),
                Case("B=3, L=5, no token types", _embeddings_case(3, 5, False)),
            ),
        ),
        Test(
            "float64",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "B=4, L=24 (every position), token types, eps left out, a token of variance 0",
                    _embeddings_case(4, 24, True, eps=None, constant_token=True),
                ),
                Case(
                    "B=1, L=1, eps=1e-3, token types left out",
                    _embeddings_case(1, 1, False, eps=1e-3, omit_none=True),
                ),
                Case(
                    "every size 1 but B=3: one word, feature, position and token type (left None)",
                    _embeddings_case(3, 1, False, **{k: ALL_ONE[k] for k in EMBEDDING_KEYS if k != "eps"}),
                ),
            ),
        ),
    ),
)

MODEL = Graded(
    name="BertModel",
    clause="09.BertModel",
    task=2,
    signature="BertModel(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, "
    "max_position_embeddings, type_vocab_size, eps=1e-12); "
    "forward(input_ids, token_type_ids=None, attention_mask=None) -> (B, L, hidden_size)",
    outputs=("last_hidden_state",),
    reference=ref.BertModel,
    kind="module",
    forbidden=FORBIDDEN,
    graded_region=lambda data: _real_positions(data.kwargs.get("attention_mask")),
    variants=(
        Variant("no-embedding-layernorm", _ModelWithoutEmbeddingLayerNorm),
        Variant("attention-mask-ignored", _ModelIgnoringMask),
    ),
    dims=(*_batch_dims(lambda c: c.args[0]), *(_size(k) for k in ALL_ONE)),
    # one layer of hidden size 3: one head (then three, where a broken split of 02 shows), a
    # padded batch (where a mask that is not passed on shows)
    small=(
        _model_case(1, 1, False, False, **SMALL_MODEL),
        _model_case(1, 2, False, True, **SMALL_MODEL),
        _model_case(1, 2, False, False, **{**SMALL_MODEL, "num_heads": 3}),
        _model_case(2, 3, True, False, **SMALL_MODEL),
    ),
    tests=(
        Test(
            "float32, padded batch",
            torch.float32,
            points=2,
            hidden=False,
            cases=(Case("B=3, L=9, 2 layers, token types", _model_case(3, 9, True, True)),),
        ),
        Test(
            "float64, padded batch",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("B=2, L=6, 2 layers", _model_case(2, 6, True, False)),),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=2,
            cases=(
                Case(
                    "B=4, L=12, 3 layers, 2 heads, eps=1e-3",
                    _model_case(4, 12, True, True, eps=1e-3, num_layers=3, num_heads=2),
                ),
                Case(
                    "B=1, L=5, 1 layer, eps, token types and mask left out, a token of variance 0",
                    _model_case(
                        1, 5, False, False, eps=None, constant_token=True, omit_none=True, num_layers=1
                    ),
                ),
                Case("every size 1 but B=2", _model_case(2, 1, False, False, **ALL_ONE)),
            ),
        ),
        Test(
            "float32, other configurations",
            torch.float32,
            points=1,
            cases=(Case("B=5, L=10, 2 layers, 8 heads", _model_case(5, 10, True, True, num_heads=8)),),
        ),
    ),
)

PRETRAINED = Graded(
    name="load_pretrained",
    clause="09.load_pretrained",
    task=3,
    signature="load_pretrained(model, weights): copies all-MiniLM-L6-v2's transformers-named "
    "weights into your BertModel",
    outputs=("last_hidden_state",),
    reference=ref.load_pretrained,
    kind="driver",
    driver="bert:pretrained",
    forbidden=FORBIDDEN,
    graded_region=lambda data: _real_positions(data.args[2]),
    tolerance=_pretrained_tolerance,
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1], never_one="a sentence holds [CLS] and [SEP]"),
    ),
    # MiniLM's real weights whatever the input, and each call builds and loads the whole
    # model (~0.3 s): one short padded pair of rows (where a mask left out shows), public
    # words, in each dtype
    small=(_pretrained_case(("cat", "the cat sat")),),
    variants=(
        Variant("layernorms-swapped", _load_with_norms_swapped),
        # mistakes of the model, seen on the real weights
        Variant("no-embedding-layernorm", _ModelWithoutEmbeddingLayerNorm, replaces="BertModel"),
        Variant("attention-mask-ignored", _ModelIgnoringMask, replaces="BertModel"),
    ),
    tests=(
        Test(
            "float32, real sentences",
            torch.float32,
            points=2,
            hidden=False,
            cases=(Case("3 sentences, padded", _pretrained_case(PUBLIC_SENTENCES)),),
        ),
        Test(
            "float32, hidden sentences and a sentence pair",
            torch.float32,
            points=2,
            cases=(Case("4 sentences + 1 pair, padded", _pretrained_case((*HIDDEN_SENTENCES, HIDDEN_PAIR))),),
        ),
        Test(
            "float64, real sentences",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("3 sentences, padded", _pretrained_case(PUBLIC_SENTENCES)),),
        ),
        Test(
            "float64, hidden sentences and a sentence pair",
            torch.float64,
            points=1,
            cases=(
                Case("4 sentences + 1 pair, padded", _pretrained_case((*HIDDEN_SENTENCES, HIDDEN_PAIR))),
                Case("1 sentence, 3 positions of padding", _pretrained_case(HIDDEN_SENTENCES[-1:], pad=3)),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="09_mini_bert",
    title="Mini-BERT on real pretrained weights",
    graded=(EMBEDDINGS, MODEL, PRETRAINED),
    uses=("02_multihead", "06_transformer_block"),
    call_timeout_s=30.0,  # a 22M-parameter model is built and loaded per call
    misconceptions={
        "no-embedding-layernorm": "your embeddings match word + position + token type without the "
        "LayerNorm: BERT normalises the sum (embeddings.LayerNorm) before the first layer.",
        "attention-mask-ignored": "your hidden states match a model that ignores attention_mask: turn "
        "it into a padding mask, attention_mask.bool()[:, None, None, :] (B, 1, 1, L), and pass it to "
        "every layer.",
        "layernorms-swapped": "your hidden states match the two LayerNorms of each layer loaded the wrong "
        "way round: attention.output.LayerNorm follows attention (norm1), output.LayerNorm follows the "
        "feed-forward network (norm2).",
    },
)
