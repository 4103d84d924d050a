"""Stage 02: multi-head attention (CURRICULUM.md, 02_multihead)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import reference
from autograder.stages import load_spec
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("02_multihead")
attention = reference.load("01_attention")

# "Forbidden as in 01": the calls that do attention's whole job. Softmax itself is
# forbidden only in 01's softmax task, so a student whose 01 attention calls torch.softmax
# (allowed there) is not penalised again here.
ATTENTION_OPS = load_spec("01_attention").graded_name("scaled_dot_product_attention").forbidden

# -- split_heads / merge_heads ------------------------------------------------------------


def _split_without_transpose(x: Tensor, num_heads: int) -> Tensor:
    B, L, d_model = x.shape
    return x.reshape(B, num_heads, L, d_model // num_heads)  # positions spill across heads


def _merge_without_transpose(x: Tensor) -> Tensor:
    B, h, L, d_k = x.shape
    return x.reshape(B, L, h * d_k)


def _merge_transposing_the_wrong_pair(x: Tensor) -> Tensor:
    B, h, L, d_k = x.shape
    return x.transpose(-2, -1).reshape(B, L, h * d_k)  # (B, h, d_k, L) flattened


def _tokens(b: int, length: int, d_model: int, h: int):
    def build(g, dtype):
        return CaseData(args=(randn(g, b, length, d_model, dtype=dtype), h))

    return build


def _heads(b: int, h: int, length: int, d_k: int):
    def build(g, dtype):
        return CaseData(args=(randn(g, b, h, length, d_k, dtype=dtype),))

    return build


# x (B, L, d_model) and num_heads; d_model = 1 is one head of one feature, allowed
SPLIT_DIMS = (
    Dim("B", lambda c: c.args[0].size(0)),
    Dim("L", lambda c: c.args[0].size(1)),
    Dim("d_model", lambda c: c.args[0].size(2)),
    Dim("num_heads", lambda c: c.args[1]),
    Dim("d_k", lambda c: c.args[0].size(2) // c.args[1]),
)
# x (B, h, L, d_k)
MERGE_DIMS = tuple(
    Dim(name, lambda c, i=i: c.args[0].size(i)) for i, name in enumerate(("B", "h", "L", "d_k"))
)

SPLIT_HEADS = Graded(
    name="split_heads",
    clause="02.split_heads",
    task=1,
    signature="split_heads(x, num_heads) -> (B, h, L, d_model // h)",
    outputs=("heads",),
    reference=ref.split_heads,
    variants=(Variant("heads-merged-wrong", _split_without_transpose),),
    dims=SPLIT_DIMS,
    # two positions and two heads: a reshape without the transpose then moves values
    small=(_tokens(1, 2, 2, 2), _tokens(1, 2, 4, 2), _tokens(1, 3, 4, 2), _tokens(2, 2, 2, 1)),
    tests=(
        Test(
            "float32, shapes",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_model=8, h=2", _tokens(2, 5, 8, 2)),
                Case("B=1, L=3, d_model=12, h=3", _tokens(1, 3, 12, 3)),
                Case("B=3, L=4, d_model=6, h=6 (d_k=1)", _tokens(3, 4, 6, 6)),
            ),
        ),
        Test(
            "float64, one head and many",
            torch.float64,
            points=1,
            cases=(
                Case("B=2, L=7, d_model=16, h=4", _tokens(2, 7, 16, 4)),
                Case("B=1, L=5, d_model=8, h=1", _tokens(1, 5, 8, 1)),
                Case("B=4, L=2, d_model=64, h=8", _tokens(4, 2, 64, 8)),
                Case("B=3, L=1, d_model=1, h=1 (one position, one feature)", _tokens(3, 1, 1, 1)),
            ),
        ),
    ),
)

MERGE_HEADS = Graded(
    name="merge_heads",
    clause="02.merge_heads",
    task=1,
    signature="merge_heads(x) -> (B, L, h * d_k)",
    outputs=("merged",),
    reference=ref.merge_heads,
    variants=(
        Variant("heads-merged-wrong", _merge_without_transpose),
        Variant("heads-merged-wrong", _merge_transposing_the_wrong_pair),
    ),
    dims=MERGE_DIMS,
    small=(_heads(1, 2, 2, 1), _heads(1, 2, 2, 2), _heads(1, 2, 3, 1), _heads(2, 1, 2, 2)),
    tests=(
        Test(
            "float64, shapes",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case("(B, h, L, d_k)=(2, 2, 5, 4)", _heads(2, 2, 5, 4)),
                Case("(B, h, L, d_k)=(1, 3, 3, 4)", _heads(1, 3, 3, 4)),
                Case("(B, h, L, d_k)=(3, 6, 4, 1)", _heads(3, 6, 4, 1)),
            ),
        ),
        Test(
            "float32, one head and many",
            torch.float32,
            points=1,
            cases=(
                Case("(B, h, L, d_k)=(2, 4, 7, 4)", _heads(2, 4, 7, 4)),
                Case("(B, h, L, d_k)=(1, 1, 5, 8)", _heads(1, 1, 5, 8)),
                Case("(B, h, L, d_k)=(4, 8, 2, 8)", _heads(4, 8, 2, 8)),
                Case("(B, h, L, d_k)=(2, 3, 1, 2) (one position)", _heads(2, 3, 1, 2)),
            ),
        ),
    ),
)

# -- MultiHeadAttention -------------------------------------------------------------------


def _forward(self, query, key, value, mask, *, split=ref.split_heads, merge=ref.merge_heads, project=True):
    """The reference forward with each knob a known mistake can turn."""
    q = split(self.w_q(query), self.num_heads)
    k = split(self.w_k(key), self.num_heads)
    v = split(self.w_v(value), self.num_heads)
    heads, weights = attention.scaled_dot_product_attention(q, k, v, mask)
    merged = merge(heads)
    return (self.w_o(merged) if project else merged), weights


def _single_head_forward(self, query, key, value, mask, *, weights_as: str):
    """One attention over all d_model features (scaled by sqrt(d_model)), as a student
    who skipped the heads writes it; ``weights_as`` is how they then shaped the weights."""
    if weights_as == "(B, Lq, Lk)" and mask is not None and mask.dim() > 2:
        # (B, 1, 1, Lk) against 3-d scores broadcasts to (B, B, Lq, Lk): not this mistake
        raise ValueError("not applicable with a 4-d mask")
    q, k, v = self.w_q(query)[:, None], self.w_k(key)[:, None], self.w_v(value)[:, None]  # (B, 1, L, d)
    out, weights = attention.scaled_dot_product_attention(q, k, v, mask)  # (B, 1, Lq, d), (B, 1, Lq, Lk)
    out = self.w_o(out[:, 0])
    if weights_as == "(B, 1, Lq, Lk)":
        return out, weights
    if weights_as == "(B, h, Lq, Lk)":  # one head's weights repeated to the expected shape
        return out, weights.expand(-1, self.num_heads, -1, -1)
    return out, weights[:, 0]


def _module_variant(forward, **knobs) -> type[ref.MultiHeadAttention]:
    """The reference module, its weights and sub-modules unchanged, with a mistaken forward."""

    class Mistaken(ref.MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            return forward(self, query, key, value, mask, **knobs)

    return Mistaken


MHA_VARIANTS = (
    Variant("heads-merged-wrong", _module_variant(_forward, merge=_merge_without_transpose)),
    Variant("heads-merged-wrong", _module_variant(_forward, merge=_merge_transposing_the_wrong_pair)),
    Variant("heads-merged-wrong", _module_variant(_forward, split=_split_without_transpose)),
    Variant(
        "heads-merged-wrong",
        _module_variant(_forward, split=_split_without_transpose, merge=_merge_without_transpose),
    ),
    *(
        Variant("single-head", _module_variant(_single_head_forward, weights_as=shape))
        for shape in ("(B, 1, Lq, Lk)", "(B, h, Lq, Lk)", "(B, Lq, Lk)")
    ),
    Variant("missing-output-projection", _module_variant(_forward, project=False)),
)


def _state(g: torch.Generator, d_model: int, bias: bool | None, dtype: torch.dtype) -> dict[str, Tensor]:
    """Weights of variance 1/d_model (as Xavier's), so activations and scores stay O(1)."""
    state = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        state[f"{name}.weight"] = randn(g, d_model, d_model, dtype=dtype, scale=1 / math.sqrt(d_model))
        if bias is not False:
            state[f"{name}.bias"] = randn(g, d_model, dtype=dtype, scale=0.5)
    return state


def _mha(
    b: int,
    lq: int,
    lk: int | None,
    d_model: int,
    h: int,
    *,
    mask: str | None = None,
    bias: bool | None = True,
    same_key_value: bool = True,
):
    """``lk=None``: self-attention (query, key and value equal); else cross-attention from a
    memory of length lk (key = value = memory unless ``same_key_value`` is False).
    ``mask``: None, "padding" (B, 1, 1, Lk), "causal" (L, L) or "padding & causal" (B, 1, L, L).
    Padding lengths lie in [1, Lk - 1]: every query keeps a key, so every row is graded.
    ``bias``: passed to the constructor, or None to leave its default (True) in place."""

    def build(g, dtype):
        state = _state(g, d_model, bias, dtype)
        query = randn(g, b, lq, d_model, dtype=dtype)
        # Equal inputs are passed as copies: the public data file (safetensors) refuses
        # tensors that share memory.
        if lk is None:
            key, value = query.clone(), query.clone()
        else:
            key = randn(g, b, lk, d_model, dtype=dtype)
            value = key.clone() if same_key_value else randn(g, b, lk, d_model, dtype=dtype)
        n_keys = lq if lk is None else lk
        m = None
        if mask in ("causal", "padding & causal"):
            m = attention.causal_mask(n_keys)  # (L, L)
        if mask in ("padding", "padding & causal"):
            pad = attention.padding_mask(randint(g, 1, n_keys, b), n_keys)  # (B, 1, 1, Lk)
            m = pad if m is None else pad & m  # (B, 1, L, L) when combined
        return CaseData(
            init_args=(d_model, h),
            init_kwargs={} if bias is None else {"bias": bias},
            state=state,
            args=(query, key, value),
            kwargs={} if m is None else {"mask": m},
        )

    return build


# query (B, Lq, d_model), key and value (B, Lk, d_model); num_heads and d_model from the
# constructor. d_model = 1 (one head of one feature) is allowed, and nn.Linear(1, 1) works.
MHA_DIMS = (
    Dim("B", lambda c: c.args[0].size(0)),
    Dim("L_q", lambda c: c.args[0].size(1)),
    Dim("L_k", lambda c: c.args[1].size(1)),
    Dim("d_model", lambda c: c.init_args[0]),
    Dim("num_heads", lambda c: c.init_args[1]),
    Dim("d_k", lambda c: c.init_args[0] // c.init_args[1]),
)

MULTI_HEAD_ATTENTION = Graded(
    name="MultiHeadAttention",
    clause="02.MultiHeadAttention",
    task=2,
    kind="module",
    signature="MultiHeadAttention(d_model, num_heads, bias=True) with sub-modules w_q, w_k, w_v, w_o; "
    "forward(query, key, value, mask=None) -> (out (B, Lq, d_model), weights (B, h, Lq, Lk))",
    outputs=("out", "weights"),
    reference=ref.MultiHeadAttention,
    forbidden=ATTENTION_OPS,
    variants=MHA_VARIANTS,
    dims=MHA_DIMS,
    # d_model = 2 in two heads of one feature (with one head, split, merge and a single
    # attention are all right), two positions; then cross-attention, the masks, no bias
    small=(
        _mha(1, 2, None, 2, 2),
        _mha(1, 1, 2, 2, 2, same_key_value=False),
        _mha(1, 2, None, 2, 1),
        _mha(1, 2, None, 2, 2, mask="padding"),
        _mha(1, 2, None, 2, 2, mask="causal"),
        _mha(1, 2, None, 2, 2, bias=False),
        # a batch of two (heads merged along the wrong axis mix the sentences), bias at its default
        _mha(2, 2, None, 2, 2, bias=None),
    ),
    tests=(
        Test(
            "float32, self-attention, no mask",
            torch.float32,
            points=2,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_model=8, h=2", _mha(2, 5, None, 8, 2)),
                Case("B=1, L=6, d_model=12, h=3", _mha(1, 6, None, 12, 3)),
                Case("B=3, L=4, d_model=16, h=4", _mha(3, 4, None, 16, 4)),
            ),
        ),
        Test(
            "float64, cross-attention (Lq != Lk)",
            torch.float64,
            points=2,
            hidden=False,
            cases=(
                Case(
                    "B=2, Lq=3, Lk=6, d_model=8, h=2, key != value", _mha(2, 3, 6, 8, 2, same_key_value=False)
                ),
                Case("B=1, Lq=5, Lk=2, d_model=6, h=3", _mha(1, 5, 2, 6, 3)),
            ),
        ),
        Test(
            "float64, padding mask",
            torch.float64,
            points=2,
            hidden=False,
            cases=(
                Case("self-attention, B=3, L=6, d_model=8, h=2", _mha(3, 6, None, 8, 2, mask="padding")),
                Case(
                    "cross-attention, B=2, Lq=4, Lk=7, d_model=12, h=4", _mha(2, 4, 7, 12, 4, mask="padding")
                ),
            ),
        ),
        Test(
            "float32, causal mask",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=2, L=5, d_model=8, h=4", _mha(2, 5, None, 8, 4, mask="causal")),),
        ),
        Test(
            "float32, bias=False",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "self-attention, padding mask, B=2, L=6, d_model=8, h=2",
                    _mha(2, 6, None, 8, 2, mask="padding", bias=False),
                ),
                Case("cross-attention, B=2, Lq=3, Lk=5, d_model=8, h=4", _mha(2, 3, 5, 8, 4, bias=False)),
            ),
        ),
        Test(
            "float64, padding and causal masks",
            torch.float64,
            points=1,
            cases=(
                Case("B=3, L=7, d_model=12, h=3", _mha(3, 7, None, 12, 3, mask="padding & causal")),
                Case(
                    "bias=False, B=2, L=5, d_model=8, h=2",
                    _mha(2, 5, None, 8, 2, mask="padding & causal", bias=False),
                ),
            ),
        ),
        Test(
            "float64, one head, and d_k = 1",
            torch.float64,
            points=1,
            cases=(
                Case("h=1, B=2, L=5, d_model=8, bias left at its default", _mha(2, 5, None, 8, 1, bias=None)),
                Case("h=d_model=6, B=2, Lq=4, Lk=3", _mha(2, 4, 3, 6, 6, mask="padding")),
                # size-1 axes: one query in one feature (one head), then one key
                Case("h=d_model=1, B=3, Lq=1, Lk=4", _mha(3, 1, 4, 1, 1)),
                Case("B=1, Lq=3, Lk=1, d_model=4, h=2", _mha(1, 3, 1, 4, 2)),
            ),
        ),
        Test(
            "float32, BERT-like width",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "B=2, L=10, d_model=64, h=8, padding mask, bias left at its default",
                    _mha(2, 10, None, 64, 8, mask="padding", bias=None),
                ),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="02_multihead",
    title="Multi-head attention",
    graded=(SPLIT_HEADS, MERGE_HEADS, MULTI_HEAD_ATTENTION),
    uses=("01_attention",),
    misconceptions={
        "heads-merged-wrong": "your output matches heads split or merged by a reshape alone: (B, L, h, d_k) "
        "and (B, h, L, d_k) order the same numbers differently. Reshape (B, L, d_model) <-> (B, L, h, d_k) "
        "and swap the head and position axes with transpose(1, 2); a reshape straight to (B, h, L, d_k) "
        "or (B, L, d_model) mixes positions and heads.",
        "single-head": "your output matches one attention over all d_model features: split each projection "
        "into num_heads heads of d_k = d_model // num_heads features, attend in every head separately "
        "(scores scaled by sqrt(d_k)), and return every head's weights, shape (B, h, Lq, Lk).",
        "missing-output-projection": "your output matches the merged heads without the output projection: "
        "return w_o(merge_heads(...)), the W^O of Concat(head_1, ..., head_h) W^O.",
    },
)
