"""Stage 06: the Transformer encoder layer, post-LN as in BERT (CURRICULUM.md, 06_transformer_block)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

import reference
from autograder.stages import load_spec
from autograder.stages.spec import Case, CaseData, Dim, Graded, StageSpec, Test, Variant, randint, randn

ref = reference.load("06_transformer_block")
attention = reference.load("01_attention")

# Every alias of the library GELU (F.gelu, nn.GELU, Tensor's in-place gelu_) reaches one of
# these operators, the tanh approximation included. Forbidden in the gelu task only: the
# feed-forward network and the layer may use any GELU, as stage 02 may use any softmax.
GELU_OPS = ("aten::gelu", "aten::gelu_", "torch.nn.functional.gelu")
# The layer itself: stage 02's forbidden calls (attention's whole job), and torch's own
# fused encoder layer (the eval-mode fast path of nn.TransformerEncoderLayer).
LAYER_OPS = load_spec("02_multihead").graded_name("MultiHeadAttention").forbidden + (
    "aten::_transformer_encoder_layer_fwd",
)

# -- gelu ---------------------------------------------------------------------------------


def _relu(x: Tensor) -> Tensor:
    return x.clamp(min=0)


def _values(*shape: int, scale: float):
    def build(g, dtype):
        return CaseData(args=(randn(g, *shape, dtype=dtype, scale=scale),))

    return build


def _label(shape: tuple[int, ...], scale: float) -> str:
    return "x" + str(tuple(shape)).replace(" ", "") + f", |x|~{scale:g}"


def _gelu_cases(specs: list[tuple[tuple[int, ...], float]]) -> tuple[Case, ...]:
    return tuple(Case(_label(shape, scale), _values(*shape, scale=scale)) for shape, scale in specs)


GELU = Graded(
    name="gelu",
    clause="06.gelu",
    task=1,
    signature="gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))",
    outputs=("y",),
    reference=ref.gelu,
    forbidden=GELU_OPS,
    variants=(Variant("relu-instead-of-gelu", _relu),),
    # the last at the wide range's magnitude: x * Phi(x) where Phi(x) rounds to 1 or 0, and
    # an erf or exp written by hand that overflows there
    small=(_values(1, scale=1.0), _values(2, scale=1.0), _values(3, scale=2.0), _values(2, scale=16.0)),
    # elementwise on any shape: each axis of x is a dimension, 1 in some case
    dims=tuple(
        Dim(
            f"x.shape[{axis}]", lambda c, axis=axis: c.args[0].shape[axis] if c.args[0].dim() > axis else None
        )
        for axis in range(4)
    ),
    tests=(
        Test(
            "float32, vectors and batches",
            torch.float32,
            points=1,
            hidden=False,
            cases=_gelu_cases([((7,), 2.0), ((3, 5), 2.0), ((2, 3, 4), 3.0)]),
        ),
        Test(
            "float64, around zero",
            torch.float64,
            points=1,
            hidden=False,
            cases=_gelu_cases([((4, 33), 1.0), ((50,), 0.1)]),
        ),
        Test(
            "float64, wide range",
            torch.float64,
            points=1,
            cases=_gelu_cases([((2, 3, 4, 5), 4.0), ((200,), 10.0), ((1,), 3.0), ((5, 1, 1, 1), 3.0)]),
        ),
        Test(
            "float32, wide range",
            torch.float32,
            points=1,
            cases=_gelu_cases([((64,), 6.0), ((8, 16), 1.0)]),
        ),
    ),
)

# -- PositionwiseFeedForward --------------------------------------------------------------


class _ReluFeedForward(ref.PositionwiseFeedForward):
    """The reference FFN, same sub-modules, with ReLU in place of GELU."""

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(_relu(self.linear1(x)))


def _linear(g, state: dict[str, Tensor], name: str, d_in: int, d_out: int, dtype) -> None:
    """Weights of variance 1/d_in (as Xavier's), so activations stay O(1); biases that count."""
    state[f"{name}.weight"] = randn(g, d_out, d_in, dtype=dtype, scale=1 / math.sqrt(d_in))
    state[f"{name}.bias"] = randn(g, d_out, dtype=dtype, scale=0.5)


def _ffn_state(g, d_model: int, d_ff: int, dtype, prefix: str = "") -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    _linear(g, state, f"{prefix}linear1", d_model, d_ff, dtype)
    _linear(g, state, f"{prefix}linear2", d_ff, d_model, dtype)
    return state


def _ffn(b: int, length: int, d_model: int, d_ff: int):
    def build(g, dtype):
        state = _ffn_state(g, d_model, d_ff, dtype)
        x = randn(g, b, length, d_model, dtype=dtype)
        return CaseData(init_args=(d_model, d_ff), state=state, args=(x,))

    return build


FEED_FORWARD = Graded(
    name="PositionwiseFeedForward",
    clause="06.PositionwiseFeedForward",
    task=2,
    kind="module",
    signature="PositionwiseFeedForward(d_model, d_ff) with sub-modules linear1, linear2; "
    "forward(x (B, L, d_model)) = linear2(gelu(linear1(x)))",
    outputs=("y",),
    reference=ref.PositionwiseFeedForward,
    variants=(Variant("relu-instead-of-gelu", _ReluFeedForward),),
    small=(_ffn(1, 1, 1, 1), _ffn(1, 1, 1, 2), _ffn(1, 1, 2, 2), _ffn(1, 2, 2, 2)),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
        Dim("d_model", lambda c: c.init_args[0]),
        Dim("d_ff", lambda c: c.init_args[1]),
    ),
    tests=(
        Test(
            "float32, shapes",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_model=8, d_ff=32", _ffn(2, 5, 8, 32)),
                Case("B=1, L=3, d_model=6, d_ff=10", _ffn(1, 3, 6, 10)),
            ),
        ),
        Test(
            "float64, shapes",
            torch.float64,
            points=1,
            cases=(
                Case("B=3, L=4, d_model=12, d_ff=48", _ffn(3, 4, 12, 48)),
                Case("B=2, L=1, d_model=4, d_ff=4", _ffn(2, 1, 4, 4)),
                Case("B=2, L=3, d_model=1, d_ff=4", _ffn(2, 3, 1, 4)),
                Case("B=3, L=2, d_model=5, d_ff=1", _ffn(3, 2, 5, 1)),
            ),
        ),
        Test(
            "float32, BERT-like width",
            torch.float32,
            points=1,
            cases=(Case("B=2, L=10, d_model=64, d_ff=256", _ffn(2, 10, 64, 256)),),
        ),
    ),
)

# -- TransformerEncoderLayer --------------------------------------------------------------


def _forward(self, x: Tensor, mask: Tensor | None, *, pre_ln: str | None = None, residual=(True, True)):
    """The reference forward with each knob a known mistake can turn.

    ``pre_ln``: None (post-LN, the reference), "x + f(norm(x))" (pre-LN as in GPT-2 and the
    Annotated Transformer), or "norm(x) + f(norm(x))" (pre-LN whose residual starts from the
    normed input). ``residual``: whether the attention and the FFN sub-layer add their input.
    """

    def attend(h: Tensor) -> Tensor:
        return self.attention(h, h, h, mask)[0]

    if pre_ln == "x + f(norm(x))":
        x = x + attend(self.norm1(x))
        return x + self.ffn(self.norm2(x))
    if pre_ln == "norm(x) + f(norm(x))":
        h = self.norm1(x)
        x = h + attend(h)
        h = self.norm2(x)
        return h + self.ffn(h)
    keep_attn, keep_ffn = residual
    x = self.norm1((x if keep_attn else 0) + attend(x))
    return self.norm2((x if keep_ffn else 0) + self.ffn(x))


def _layer_variant(**knobs) -> type[ref.TransformerEncoderLayer]:
    """The reference layer, its weights and sub-modules unchanged, with a mistaken forward."""

    class Mistaken(ref.TransformerEncoderLayer):
        def forward(self, x, mask=None):
            return _forward(self, x, mask, **knobs)

    return Mistaken


class _ReluLayer(ref.TransformerEncoderLayer):
    """The reference layer whose FFN uses ReLU."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 1e-12) -> None:
        super().__init__(d_model, num_heads, d_ff, eps)
        self.ffn = _ReluFeedForward(d_model, d_ff)


LAYER_VARIANTS = (
    Variant("pre-ln-instead-of-post-ln", _layer_variant(pre_ln="x + f(norm(x))")),
    Variant("pre-ln-instead-of-post-ln", _layer_variant(pre_ln="norm(x) + f(norm(x))")),
    Variant("missing-residual", _layer_variant(residual=(False, True))),
    Variant("missing-residual", _layer_variant(residual=(True, False))),
    Variant("missing-residual", _layer_variant(residual=(False, False))),
    Variant("relu-instead-of-gelu", _ReluLayer),
)


def _layer_state(g, d_model: int, d_ff: int, dtype) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    for name in ("w_q", "w_k", "w_v", "w_o"):
        _linear(g, state, f"attention.{name}", d_model, d_model, dtype)
    for norm in ("norm1", "norm2"):
        # gamma away from 1 and beta away from 0, so that each norm's own weights count
        state[f"{norm}.weight"] = 1 + randn(g, d_model, dtype=dtype, scale=0.3)
        state[f"{norm}.bias"] = randn(g, d_model, dtype=dtype, scale=0.3)
    state |= _ffn_state(g, d_model, d_ff, dtype, prefix="ffn.")
    return state


def _layer(
    b: int,
    length: int,
    d_model: int,
    h: int,
    d_ff: int,
    *,
    mask: str | None = None,
    eps=None,
    zero_variance_row: bool = False,
):
    """``mask``: None, "padding" (B, 1, 1, L), "causal" (L, L) or "padding & causal" (B, 1, L, L).
    Padding lengths lie in [1, L]: every query keeps a key, so every position is graded.
    ``eps``: None leaves the constructor's default (1e-12) in place.
    ``zero_variance_row``: w_o zero-initialised (as some schemes start a residual branch) and
    x[0, 0] a zero vector, so norm1 normalises a row of variance exactly 0: eps alone keeps
    it finite (the output is norm1's bias there)."""

    def build(g, dtype):
        state = _layer_state(g, d_model, d_ff, dtype)
        x = randn(g, b, length, d_model, dtype=dtype)
        if zero_variance_row:
            state["attention.w_o.weight"].zero_()
            state["attention.w_o.bias"].zero_()
            x[0, 0] = 0.0
        m = None
        if mask in ("causal", "padding & causal"):
            m = attention.causal_mask(length)  # (L, L)
        if mask in ("padding", "padding & causal"):
            lengths = randint(g, 1, length + 1, b)
            lengths[0] = max(1, length - 2)  # at least one sequence padded
            pad = attention.padding_mask(lengths, length)  # (B, 1, 1, L)
            m = pad if m is None else pad & m  # (B, 1, L, L) when combined
        return CaseData(
            init_args=(d_model, h, d_ff),
            init_kwargs={} if eps is None else {"eps": eps},
            state=state,
            args=(x,),
            kwargs={} if m is None else {"mask": m},
        )

    return build


ENCODER_LAYER = Graded(
    name="TransformerEncoderLayer",
    clause="06.TransformerEncoderLayer",
    task=3,
    kind="module",
    signature="TransformerEncoderLayer(d_model, num_heads, d_ff, eps=1e-12) with sub-modules "
    "attention, norm1, ffn, norm2; forward(x (B, L, d_model), mask=None) -> (B, L, d_model)",
    outputs=("out",),
    reference=ref.TransformerEncoderLayer,
    forbidden=LAYER_OPS,
    variants=LAYER_VARIANTS,
    # d_model = 3: a LayerNorm over one feature is its bias whatever came in, and over two
    # only the sign of their difference counts; one head and one hidden unit, then two
    # positions, three heads, a padding mask
    small=(
        _layer(1, 1, 3, 1, 1),
        _layer(1, 2, 3, 1, 1),
        _layer(1, 2, 3, 3, 2),
        _layer(1, 3, 3, 1, 2, mask="padding"),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1]),
        Dim("d_model", lambda c: c.init_args[0]),
        Dim("num_heads", lambda c: c.init_args[1]),
        Dim("d_ff", lambda c: c.init_args[2]),
    ),
    tests=(
        Test(
            "float32, no mask",
            torch.float32,
            points=2,
            hidden=False,
            cases=(
                Case("B=2, L=5, d_model=8, h=2, d_ff=32", _layer(2, 5, 8, 2, 32)),
                Case("B=1, L=6, d_model=12, h=3, d_ff=24", _layer(1, 6, 12, 3, 24)),
            ),
        ),
        Test(
            "float64, padding mask",
            torch.float64,
            points=2,
            hidden=False,
            cases=(
                Case("B=3, L=6, d_model=8, h=2, d_ff=16", _layer(3, 6, 8, 2, 16, mask="padding")),
                Case("B=2, L=7, d_model=16, h=4, d_ff=64", _layer(2, 7, 16, 4, 64, mask="padding")),
            ),
        ),
        Test(
            "float64, eps passed to both norms",
            torch.float64,
            points=1,
            cases=(
                Case("eps=1e-5, B=2, L=5, d_model=8, h=2, d_ff=32", _layer(2, 5, 8, 2, 32, eps=1e-5)),
                Case(
                    "eps=1e-3, B=2, L=4, d_model=12, h=4, d_ff=24, padding mask",
                    _layer(2, 4, 12, 4, 24, mask="padding", eps=1e-3),
                ),
                Case(
                    "eps left at its default, w_o = 0 and x[0, 0] = 0 (norm1 sees a row of variance 0), "
                    "B=2, L=3, d_model=4, h=2, d_ff=8",
                    _layer(2, 3, 4, 2, 8, zero_variance_row=True),
                ),
            ),
        ),
        Test(
            "float32, BERT-like width",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "B=2, L=10, d_model=64, h=8, d_ff=256, padding mask",
                    _layer(2, 10, 64, 8, 256, mask="padding"),
                ),
            ),
        ),
        Test(
            "float64, causal masks",
            torch.float64,
            points=1,
            cases=(
                Case("causal, B=2, L=5, d_model=8, h=2, d_ff=16", _layer(2, 5, 8, 2, 16, mask="causal")),
                Case(
                    "padding & causal, B=3, L=6, d_model=12, h=3, d_ff=36",
                    _layer(3, 6, 12, 3, 36, mask="padding & causal"),
                ),
            ),
        ),
        Test(
            "float32, one head, and d_k = 1",
            torch.float32,
            points=1,
            cases=(
                Case("h=1, B=2, L=4, d_model=8, d_ff=16", _layer(2, 4, 8, 1, 16)),
                Case("h=d_model=6, B=2, L=5, d_ff=10, padding mask", _layer(2, 5, 6, 6, 10, mask="padding")),
                Case("L=1, d_ff=1, B=3, d_model=4, h=2, padding mask", _layer(3, 1, 4, 2, 1, mask="padding")),
                # a LayerNorm over one feature: each norm's output is its bias
                Case(
                    "h=d_model=1 (each norm sees rows of variance 0), B=2, L=3, d_ff=4", _layer(2, 3, 1, 1, 4)
                ),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="06_transformer_block",
    title="The Transformer encoder layer",
    graded=(GELU, FEED_FORWARD, ENCODER_LAYER),
    uses=("02_multihead",),
    misconceptions={
        "pre-ln-instead-of-post-ln": "your output matches a pre-LN layer (x + f(norm(x)), as in GPT-2): BERT "
        "is post-LN. Add the sub-layer's output to its input first, then normalise the sum: "
        "x = norm1(x + attention(x, x, x, mask)[0]); x = norm2(x + ffn(x)).",
        "missing-residual": "your output matches a layer that drops a residual connection: each sub-layer's "
        "output is added to its own input before the norm, norm1(x + attention(...)[0]) and "
        "norm2(x + ffn(x)), in both sub-layers.",
        "relu-instead-of-gelu": "your output matches ReLU where GELU belongs: BERT's activation is "
        "GELU(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))), which is smooth and slightly negative "
        "for x < 0; use your own gelu in the feed-forward network.",
    },
)
