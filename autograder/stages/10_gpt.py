"""Stage 10: a GPT decoder and generation (CURRICULUM.md, 10_gpt).

``gelu_tanh`` and ``GPTBlock`` are called directly (the block with and without a random
``past``); ``GPT`` goes through the ``gpt:chunked`` driver, which feeds a sequence in
chunks with the cache, so a cache is graded against what the reference computes for the
same chunks (which equals one call on the whole sequence); ``to_gpt2_state_dict`` through
``gpt:export`` (GPT-2's keys, values grouped by key); the decoders through ``gpt:greedy``
and ``gpt:sampled`` on small random GPTs (the model's calls recorded); ``filter_logits``
through ``gpt:filtered``, which compares the kept tokens exactly and their values within
the tolerance. Models are tiny: every call takes milliseconds.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

import reference
from autograder.runtime.drivers import gpt as gpt_driver
from autograder.stages import load_spec
from autograder.stages.spec import (
    Case,
    CaseData,
    Dim,
    Graded,
    StageSpec,
    Test,
    Variant,
    own_values,
    randint,
    randn,
)

ref = reference.load("10_gpt")
attention = reference.load("01_attention")
multihead = reference.load("02_multihead")

# The block, the model and the decoders run the student's 01 attention on 02's heads: they
# forbid what 02's MultiHeadAttention forbids (the library attention and the layers built on
# it, a decoder layer included) and nothing that code may call (softmax, GELU, LayerNorm).
FORBIDDEN = load_spec("02_multihead").graded_name("MultiHeadAttention").forbidden
GELU_OPS = load_spec("06_transformer_block").graded_name("gelu").forbidden

TINY = dict(
    vocab_size=50,
    hidden_size=16,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    max_position_embeddings=20,
    eps=1e-5,
)


# The smallest GPT counterexamples are tried on (``Graded.small``): a hidden size of 3 (a
# LayerNorm over 2 values keeps only the sign of their difference), a vocabulary of 3.
SMALL_GPT = dict(
    vocab_size=3, hidden_size=3, num_layers=1, num_heads=1, intermediate_size=2, max_position_embeddings=8
)
# Two layers: a prompt's first positions change what the second layer's cache holds (with
# one layer the cache is its input's projection, whatever attention did).
SMALL_GPT2 = {**SMALL_GPT, "num_layers": 2, "vocab_size": 5, "hidden_size": 4, "num_heads": 2}


def _random_state(module: torch.nn.Module, g: torch.Generator, dtype: torch.dtype) -> dict[str, Tensor]:
    """Random values for every entry of ``module``'s state dict: LayerNorm gains near 1,
    everything else of scale 0.5 (biases that count, logits of spread ~2)."""
    state = {}
    for name, value in sorted(module.state_dict().items()):
        t = randn(g, *value.shape, dtype=dtype, scale=0.5)
        if ".ln_" in f".{name}" and name.endswith(".weight"):
            t = t * 0.4 + 1.0
        state[name] = t
    return state


def _config(eps: float | None, overrides: dict) -> dict:
    """GPT's constructor arguments; ``eps=None`` leaves eps out, so its default is graded."""
    config = {**{k: v for k, v in TINY.items() if k != "eps"}, **overrides}
    return config if eps is None else {**config, "eps": eps}


def _model_case(config: dict, g: torch.Generator, dtype: torch.dtype) -> tuple[dict, dict[str, Tensor]]:
    state = _random_state(ref.GPT(**config), g, dtype)
    return config, state


# -- gelu_tanh ------------------------------------------------------------------------------


def _gelu_erf(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _values(*shape: int, scale: float):
    def build(g, dtype):
        return CaseData(args=(randn(g, *shape, dtype=dtype, scale=scale),))

    return build


def _axis(x: Tensor, i: int) -> int | None:
    return x.shape[i] if x.dim() > i else None


def _gelu_cases(specs: list[tuple[tuple[int, ...], float]]) -> tuple[Case, ...]:
    return tuple(
        Case("x" + str(tuple(shape)).replace(" ", "") + f", |x|~{scale:g}", _values(*shape, scale=scale))
        for shape, scale in specs
    )


GELU_TANH = Graded(
    name="gelu_tanh",
    clause="10.gelu_tanh",
    task=1,
    signature="gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))",
    outputs=("y",),
    reference=ref.gelu_tanh,
    forbidden=GELU_OPS,
    variants=(Variant("gelu-erf-instead-of-tanh", _gelu_erf),),
    # elementwise on any shape: each axis of x, up to the four the cases have
    dims=tuple(Dim(f"x.shape[{i}]", lambda c, i=i: _axis(c.args[0], i)) for i in range(4)),
    # one value, then a few (tanh's and erf's GELU part in the fourth digit at x = 1), then
    # two large ones (|x| up to 45: a tanh written with exp overflows there)
    small=(
        _values(1, scale=1.0),
        _values(2, scale=1.0),
        _values(3, scale=2.0),
        _values(2, scale=15.0),
    ),
    tests=(
        Test(
            "float32, vectors and batches",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=_gelu_cases([((9,), 2.0), ((3, 5), 3.0)]),
        ),
        Test(
            "float64, around zero",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=_gelu_cases([((4, 33), 1.0)]),
        ),
        Test(
            "float64, wide range",
            torch.float64,
            points=0.5,
            cases=_gelu_cases([((2, 3, 4, 5), 4.0), ((200,), 10.0)]),
        ),
        Test(
            "float32, wide range",
            torch.float32,
            points=0.5,
            cases=_gelu_cases([((64,), 6.0), ((8, 16), 1.0), ((1, 1, 1, 1), 3.0)]),
        ),
    ),
)

# -- GPTBlock ---------------------------------------------------------------------------------


def _attend(self, h: Tensor, past: Tensor | None, *, mask_rows: str | None) -> tuple[Tensor, Tensor]:
    """The block's cached attention with the mask as a knob: "last" (the reference's rows
    L_past ... L - 1), "first" (rows 0 ... T - 1: the new tokens taken for positions from 0),
    or None (no mask at all)."""
    T = h.size(1)
    q = multihead.split_heads(self.attn.w_q(h), self.num_heads)
    k = multihead.split_heads(self.attn.w_k(h), self.num_heads)
    v = multihead.split_heads(self.attn.w_v(h), self.num_heads)
    if past is not None:
        k, v = torch.cat([past[:, 0], k], dim=-2), torch.cat([past[:, 1], v], dim=-2)
    L = k.size(-2)
    mask = None
    if mask_rows is not None:
        full = attention.causal_mask(L).to(h.device)
        mask = full[L - T :] if mask_rows == "last" else full[:T]
    heads, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    return self.attn.w_o(multihead.merge_heads(heads)), torch.stack([k, v], dim=1)


class _ErfMLP(ref.MLP):
    def forward(self, h: Tensor) -> Tensor:
        return self.c_proj(_gelu_erf(self.c_fc(h)))


def _block_variant(*, post_ln: bool = False, mask_rows: str | None = "last", erf: bool = False):
    """The reference block, its weights and sub-modules unchanged, with a mistaken forward."""

    class Mistaken(ref.GPTBlock):
        def __init__(self, d_model: int, num_heads: int, d_ff: int, eps: float = 1e-5) -> None:
            super().__init__(d_model, num_heads, d_ff, eps)
            if erf:
                self.mlp.__class__ = _ErfMLP

        def forward(self, x: Tensor, past: Tensor | None = None) -> tuple[Tensor, Tensor]:
            if post_ln:  # BERT's wiring (06): norm the residual sums
                a, present = _attend(self, x, past, mask_rows=mask_rows)
                x = self.ln_1(x + a)
                return self.ln_2(x + self.mlp(x)), present
            a, present = _attend(self, self.ln_1(x), past, mask_rows=mask_rows)
            x = x + a
            return x + self.mlp(self.ln_2(x)), present

    return Mistaken


BLOCK_MISTAKES = {
    "post-ln-instead-of-pre-ln": {"post_ln": True},
    "no-causal-mask": {"mask_rows": None},
    "cache-positions-restart": {"mask_rows": "first"},
    "gelu-erf-instead-of-tanh": {"erf": True},
}


def _block_case(
    b: int,
    t: int,
    d_model: int,
    h: int,
    d_ff: int,
    *,
    past: int | None = None,
    eps: float | None = 1e-5,
):
    """``past``: None leaves it out of the call; else a random cache of that many positions.
    ``eps``: None leaves it out of the constructor (its default is graded)."""

    def build(g, dtype):
        block = ref.GPTBlock(d_model, h, d_ff)
        state = _random_state(block, g, dtype)
        x = randn(g, b, t, d_model, dtype=dtype)
        kwargs = {}
        if past is not None:
            kwargs["past"] = randn(g, b, 2, h, past, d_model // h, dtype=dtype)
        return CaseData(
            init_args=(d_model, h, d_ff),
            init_kwargs={} if eps is None else {"eps": eps},
            state=state,
            args=(x,),
            kwargs=kwargs,
        )

    return build


BLOCK = Graded(
    name="GPTBlock",
    clause="10.GPTBlock",
    task=2,
    kind="module",
    signature="GPTBlock(d_model, num_heads, d_ff, eps=1e-5) with sub-modules ln_1, attn, ln_2, "
    "mlp (mlp.c_fc, mlp.c_proj); forward(x (B, T, d_model), past=None) -> "
    "(out (B, T, d_model), present (B, 2, num_heads, L_past + T, d_k))",
    outputs=("out", "present"),
    reference=ref.GPTBlock,
    forbidden=FORBIDDEN,
    variants=tuple(Variant(mid, _block_variant(**knobs)) for mid, knobs in BLOCK_MISTAKES.items()),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("T", lambda c: c.args[0].shape[1]),
        Dim("d_model", lambda c: c.init_args[0]),
        Dim("num_heads", lambda c: c.init_args[1]),
        Dim("d_ff", lambda c: c.init_args[2]),
        Dim("d_k", lambda c: c.init_args[0] // c.init_args[1]),
        Dim("L_past", lambda c: c.kwargs["past"].shape[3] if "past" in c.kwargs else None),
    ),
    # d_model = 3 (a LayerNorm over one feature is its bias, over two only a sign), one
    # head; two positions (a mask to apply), then after a cache of one and two positions;
    # eps left at its default (a wrong default) and eps = 0.5 (an eps not passed on)
    small=(
        _block_case(1, 2, 3, 1, 1),
        _block_case(1, 1, 3, 1, 1, past=1),
        _block_case(1, 2, 3, 1, 2, past=1),
        _block_case(1, 2, 4, 2, 2, past=2),
        _block_case(1, 2, 3, 1, 1, eps=None),
        _block_case(1, 2, 3, 1, 1, eps=0.5),
    ),
    tests=(
        Test(
            "float32, no cache",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("B=2, T=5, d_model=16, h=4, d_ff=64", _block_case(2, 5, 16, 4, 64)),
                Case("B=1, T=3, d_model=8, h=2, d_ff=24", _block_case(1, 3, 8, 2, 24)),
            ),
        ),
        Test(
            "float64, with a past",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case(
                    "B=2, T=4 after L_past=3, d_model=16, h=4, d_ff=64", _block_case(2, 4, 16, 4, 64, past=3)
                ),
                Case("B=2, T=1 after L_past=6 (one decoding step)", _block_case(2, 1, 16, 4, 64, past=6)),
            ),
        ),
        Test(
            "float64, eps",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "eps left at its default, B=2, T=6, d_model=8, h=2, d_ff=32",
                    _block_case(2, 6, 8, 2, 32, eps=None),
                ),
                Case(
                    "eps=1e-3, T=3 after L_past=2, d_model=12, h=3, d_ff=20",
                    _block_case(3, 3, 12, 3, 20, past=2, eps=1e-3),
                ),
            ),
        ),
        Test(
            "float32, one head, d_k = 1, longer pasts",
            torch.float32,
            points=1,
            cases=(
                Case("h=1, B=2, T=4 after L_past=5, d_model=8, d_ff=16", _block_case(2, 4, 8, 1, 16, past=5)),
                Case("h=d_model=6, B=2, T=2 after L_past=9, d_ff=12", _block_case(2, 2, 6, 6, 12, past=9)),
                Case("d_model=h=d_ff=1, B=2, T=3 after L_past=1", _block_case(2, 3, 1, 1, 1, past=1)),
            ),
        ),
        Test(
            "float64, GPT-2 small's ratios",
            torch.float64,
            points=1,
            cases=(Case("B=2, T=7, d_model=48, h=12, d_ff=192", _block_case(2, 7, 48, 12, 192)),),
        ),
    ),
)

# -- GPT ----------------------------------------------------------------------------------------


def _gpt_variant(
    *, block: dict | None = None, positions_restart: bool = False, final_norm: bool = True
) -> type[ref.GPT]:
    """The reference model, its weights and sub-modules unchanged, with a mistake in its
    forward or in every block's."""
    mistaken_block = _block_variant(**block) if block else None

    class Mistaken(ref.GPT):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            for b in self.h:
                if mistaken_block is not None:
                    b.__class__ = mistaken_block
                    if block.get("erf"):
                        b.mlp.__class__ = _ErfMLP

        def forward(self, input_ids: Tensor, past: Tensor | None = None) -> tuple[Tensor, Tensor]:
            T = input_ids.size(1)
            start = 0 if past is None or positions_restart else past.size(-2)
            x = self.wte(input_ids) + self.wpe(torch.arange(start, start + T, device=input_ids.device))
            presents = []
            for i, b in enumerate(self.h):
                x, present = b(x, None if past is None else past[:, i])
                presents.append(present)
            if final_norm:
                x = self.ln_f(x)
            return x @ self.wte.weight.T, torch.stack(presents, dim=1)

    return Mistaken


GPT_MISTAKES = (
    ("no-final-layernorm", {"final_norm": False}),
    ("cache-positions-restart", {"positions_restart": True}),
    ("cache-positions-restart", {"block": {"mask_rows": "first"}}),
    ("cache-positions-restart", {"positions_restart": True, "block": {"mask_rows": "first"}}),
    ("no-causal-mask", {"block": {"mask_rows": None}}),
    ("post-ln-instead-of-pre-ln", {"block": {"post_ln": True}}),
    ("gelu-erf-instead-of-tanh", {"block": {"erf": True}}),
)


# GPT's sizes, each 1 in a case of every name that builds a GPT of the case's own (a vocabulary
# of one token, a LayerNorm over one feature: degenerate, and allowed).
MODEL_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "max_position_embeddings",
)
ALL_ONE = dict.fromkeys(MODEL_SIZES, 1)


def _chunked_case(b: int, chunks: list[int], *, eps: float | None = 1e-5, **overrides: int):
    """A random GPT and a sequence of sum(chunks) tokens fed in those chunks."""

    def build(g, dtype):
        config, state = _model_case(_config(eps, overrides), g, dtype)
        input_ids = randint(g, 0, config["vocab_size"], b, sum(chunks))
        return CaseData(args=(input_ids,), kwargs={"chunks": list(chunks)}, init_kwargs=config, state=state)

    return build


MODEL = Graded(
    name="GPT",
    clause="10.GPT",
    task=3,
    kind="driver",
    driver="gpt:chunked",
    signature="GPT(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, "
    "max_position_embeddings, eps=1e-5) with sub-modules wte, wpe, h, ln_f; "
    "forward(input_ids (B, T), past=None) -> (logits (B, T, vocab_size), "
    "present (B, num_layers, 2, num_heads, L_past + T, d_k))",
    outputs=("logits", "present"),
    reference=ref.GPT,
    forbidden=FORBIDDEN,
    variants=tuple(Variant(mid, _gpt_variant(**knobs)) for mid, knobs in GPT_MISTAKES),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L_past + T", lambda c: c.args[0].shape[1]),
        Dim("T (the shortest chunk)", lambda c: min(c.kwargs["chunks"])),
        Dim("calls (chunks)", lambda c: len(c.kwargs["chunks"])),
        *(Dim(k, lambda c, k=k: c.init_kwargs[k]) for k in MODEL_SIZES),
    ),
    # the smallest GPT: two tokens at once, then one at a time (the cache), then 2 + 1;
    # eps left at its default and eps = 0.5, as GPTBlock's
    small=(
        _chunked_case(1, [2], **SMALL_GPT),
        _chunked_case(1, [1, 1], **SMALL_GPT),
        _chunked_case(1, [2, 1], **SMALL_GPT),
        _chunked_case(2, [2, 2], **{**SMALL_GPT, "hidden_size": 4, "num_heads": 2}),
        _chunked_case(1, [2], eps=None, **SMALL_GPT),
        _chunked_case(1, [2], eps=0.5, **SMALL_GPT),
    ),
    tests=(
        Test(
            "float32, one call",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=2, T=8", _chunked_case(2, [8])),),
        ),
        Test(
            "float64, a prompt, then one token at a time",
            torch.float64,
            points=1,
            hidden=False,
            cases=(Case("B=2, prompt of 5, then 4 tokens", _chunked_case(2, [5, 1, 1, 1, 1])),),
        ),
        Test(
            "float64, chunks of several tokens, every position",
            torch.float64,
            points=1,
            cases=(
                Case("B=3, chunks of 3, 4 and 2", _chunked_case(3, [3, 4, 2])),
                Case("B=1, two chunks of 10: all 20 positions", _chunked_case(1, [10, 10])),
            ),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "3 layers, d_k = 1, eps left at its default, B=2, prompt of 4, then 3 tokens",
                    _chunked_case(2, [4, 1, 1, 1], eps=None, num_layers=3, hidden_size=6, num_heads=6),
                ),
                Case(
                    "1 layer, 1 head, eps=1e-3, B=2, one call",
                    _chunked_case(2, [6], eps=1e-3, num_layers=1, num_heads=1, intermediate_size=24),
                ),
                Case("every size 1 but B=2: one token, one call", _chunked_case(2, [1], **ALL_ONE)),
            ),
        ),
        Test(
            "float32, one token at a time from the start",
            torch.float32,
            points=1,
            cases=(Case("B=3, 9 chunks of 1", _chunked_case(3, [1] * 9)),),
        ),
    ),
)

# -- causal_lm_loss -----------------------------------------------------------------------------


def _unshifted(logits: Tensor, labels: Tensor) -> Tensor:
    """Position t's prediction against token t: the loss of copying the input."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def _shifted_backwards(logits: Tensor, labels: Tensor) -> Tensor:
    """Position t + 1's prediction against token t: the shift the wrong way round."""
    return ref.causal_lm_loss(logits.flip(1), labels.flip(1))


def _loss_case(b: int, length: int, vocab: int, *, ignored: float = 0.0, prompt: int = 0, scale: float = 2.0):
    """Random logits and labels; ``prompt`` leading labels of every row, and a share
    ``ignored`` of the others, are -100 (the last position of row 0 always counts)."""

    def build(g, dtype):
        logits = randn(g, b, length, vocab, dtype=dtype, scale=scale)
        labels = randint(g, 0, vocab, b, length)
        drop = torch.rand(b, length, generator=g) < ignored
        drop[:, :prompt] = True
        drop[0, -1] = False
        labels[drop] = -100
        return CaseData(args=(logits, labels))

    return build


LOSS = Graded(
    name="causal_lm_loss",
    clause="10.causal_lm_loss",
    task=4,
    signature="causal_lm_loss(logits (B, L, V), labels (B, L)) -> scalar",
    outputs=("loss",),
    reference=ref.causal_lm_loss,
    variants=(
        Variant("labels-not-shifted", _unshifted),
        Variant("labels-not-shifted", _shifted_backwards),
    ),
    dims=(
        Dim("B", lambda c: c.args[0].shape[0]),
        Dim("L", lambda c: c.args[0].shape[1], never_one="a pair (t, t + 1) needs two positions"),
        Dim("V", lambda c: c.args[0].shape[2]),
    ),
    # two positions (one prediction), then a -100 prompt, then labels left out at random;
    # then logits up to |192|, where exp overflows (float32 past 88, float64 past 709 in a
    # sum of exps) and a softmax underflows to 0 (0 * log 0 = NaN in a one-hot cross-entropy)
    small=(
        _loss_case(1, 2, 2),
        _loss_case(1, 3, 2, prompt=1),
        _loss_case(2, 3, 3, ignored=0.5),
        _loss_case(1, 2, 3, scale=64.0),
        _loss_case(1, 3, 3, scale=64.0),
    ),
    tests=(
        Test(
            "float32, every label counts",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("B=2, L=6, V=10", _loss_case(2, 6, 10)),),
        ),
        Test(
            "float64, a prompt of -100",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(Case("B=3, L=8, V=20, the first 3 labels -100", _loss_case(3, 8, 20, prompt=3)),),
        ),
        Test(
            "float64, scattered -100 and short rows",
            torch.float64,
            points=1,
            cases=(
                Case("B=4, L=9, V=50, 40% of labels -100", _loss_case(4, 9, 50, ignored=0.4)),
                Case("B=2, L=2, V=7: one pair per row", _loss_case(2, 2, 7)),
                Case(
                    "B=2, L=5, V=30, only the last label counts",
                    _loss_case(2, 5, 30, prompt=4),
                ),
                Case("B=3, L=3, V=1: one token, a loss of 0", _loss_case(3, 3, 1)),
            ),
        ),
        Test(
            "float32, GPT-2's scale of logits",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "B=3, L=12, V=100, |logits|~8, 20% -100", _loss_case(3, 12, 100, ignored=0.2, scale=8.0)
                ),
                Case(
                    "B=1, L=7, V=12, |logits|~100 (exp overflows float32: a stable log-softmax)",
                    _loss_case(1, 7, 12, scale=100.0),
                ),
            ),
        ),
    ),
)

# -- to_gpt2_state_dict --------------------------------------------------------------------------

# GPT-2's keys, as the export driver returns their values: "attn_c_attn_weight
# (transformer.h.*.attn.c_attn.weight, stacked over the layers)".
EXPORT_OUTPUTS = tuple(
    key.removeprefix("transformer.").removeprefix("h.*.").replace(".", "_")
    + f" ({key}{', stacked over the layers' if '*' in key else ''})"
    for key in gpt_driver.GPT2_KEYS
)


# c_attn's weight as students build it, from the right one (d, 3d) = [w_q.T | w_k.T | w_v.T]:
C_ATTN_LAYOUTS = {
    "right": lambda w: w,
    # torch.cat([w_q, w_k, w_v]): nn.Linear's layouts stacked as rows, (3d, d)
    "rows": lambda w: w.T,
    # torch.cat([w_q, w_k, w_v], dim=1): the right shape, (d, 3d), each block untransposed
    "blocks": lambda w: torch.cat([b.T for b in w.chunk(3, dim=1)], dim=1),
    # torch.cat([w_q.T, w_k.T, w_v.T]): each block transposed, stacked as rows, (3d, d)
    "transposed rows": lambda w: torch.cat(w.chunk(3, dim=1), dim=0),
}
OTHER_CONV1D = ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _export_untransposed(c_attn: str, *which: str):
    """to_gpt2_state_dict with c_attn's weight in one of ``C_ATTN_LAYOUTS`` and the other
    Conv1D weights ending in ``which`` left in nn.Linear's (out, in) layout."""

    def export(model):
        state = ref.to_gpt2_state_dict(model)
        out = {}
        for k, v in state.items():
            if ".h." in k and k.endswith("attn.c_attn.weight"):
                v = C_ATTN_LAYOUTS[c_attn](v)
            elif ".h." in k and k.endswith(which):
                v = v.T
            out[k] = v
        return out

    return export


# Every layout of c_attn with every choice of the other three weights transposed or not,
# the right export aside: the literal form (every nn.Linear weight as it is, c_attn
# concatenated along dim 1) and every partial one.
EXPORT_MISTAKES = tuple(
    (c_attn, tuple(w for w, keep in zip(OTHER_CONV1D, kept, strict=True) if not keep))
    for c_attn in C_ATTN_LAYOUTS
    for kept in itertools.product((False, True), repeat=len(OTHER_CONV1D))
    if not (c_attn == "right" and all(kept))
)


def _export_case(*, eps: float | None = 1e-5, **overrides: int):
    def build(g, dtype):
        config, state = _model_case(_config(eps, overrides), g, dtype)
        return CaseData(init_kwargs=config, state=state)

    return build


EXPORT = Graded(
    name="to_gpt2_state_dict",
    clause="10.to_gpt2_state_dict",
    task=5,
    kind="driver",
    driver="gpt:export",
    signature="to_gpt2_state_dict(model) -> dict: your GPT's weights under GPT2LMHeadModel's names "
    "and Conv1D layouts",
    outputs=EXPORT_OUTPUTS,
    reference=ref.to_gpt2_state_dict,
    variants=tuple(
        Variant("conv1d-not-transposed", _export_untransposed(c_attn, *which))
        for c_attn, which in EXPORT_MISTAKES
    ),
    dims=tuple(Dim(k, lambda c, k=k: c.init_kwargs[k]) for k in MODEL_SIZES),
    # one layer of hidden size 2 and 3 (every Conv1D weight is then (in, out) of two shapes)
    small=(
        _export_case(**{**SMALL_GPT, "hidden_size": 2}),
        _export_case(**SMALL_GPT),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("2 layers, hidden 16, 4 heads, intermediate 64", _export_case()),),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(
                Case(
                    "1 layer, hidden 8, 2 heads, intermediate 24",
                    _export_case(num_layers=1, hidden_size=8, num_heads=2, intermediate_size=24),
                ),
            ),
        ),
        Test(
            "float64, other configurations",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "3 layers, hidden 6, 6 heads, intermediate 10, eps left out",
                    _export_case(eps=None, num_layers=3, hidden_size=6, num_heads=6, intermediate_size=10),
                ),
                Case("every size 1", _export_case(**ALL_ONE)),
            ),
        ),
        Test(
            "float32, square weights",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "intermediate = hidden = 16: every Conv1D weight square but c_attn",
                    _export_case(intermediate_size=16),
                ),
            ),
        ),
    ),
)

# -- decoding -------------------------------------------------------------------------------------


# A decoder may run the model on its last new token ([10.greedy_decode]): a case's GPT holds
# L + max_new_tokens positions, so its sizes are not all 1 (B, L, max_new_tokens, the layers
# and heads are).
DECODER_DIMS = (
    Dim("B", lambda c: c.args[0].shape[0]),
    Dim("L", lambda c: c.args[0].shape[1]),
    Dim("max_new_tokens", lambda c: c.kwargs["max_new_tokens"]),
    Dim("num_layers", lambda c: c.init_kwargs["num_layers"]),
    Dim("num_heads", lambda c: c.init_kwargs["num_heads"]),
)


def _decode(model, input_ids: Tensor, max_new_tokens: int, pick, *, cache: bool = True) -> Tensor:
    """The decoding loop with the cache as a knob: without it, the whole sequence goes
    through the model at every step."""
    tokens = input_ids
    logits, past = model(input_ids)
    for step in range(max_new_tokens):
        new = pick(logits[:, -1])
        tokens = torch.cat([tokens, new], dim=1)
        if step + 1 < max_new_tokens:
            logits, past = model(new, past=past) if cache else model(tokens)
    return tokens


def _greedy_without_cache(model, input_ids: Tensor, max_new_tokens: int) -> Tensor:
    return _decode(model, input_ids, max_new_tokens, lambda x: x.argmax(-1, keepdim=True), cache=False)


# The model's mistakes that change what it generates, seen through a decoder.
DECODED_MISTAKES = tuple((mid, knobs) for mid, knobs in GPT_MISTAKES if mid != "gelu-erf-instead-of-tanh")


def _decoding_case(b: int, prompt: int, new: int, *, eps: float | None = 1e-5, **overrides: int):
    def build(g, dtype):
        config, state = _model_case(_config(eps, overrides), g, dtype)
        input_ids = randint(g, 0, config["vocab_size"], b, prompt)
        return CaseData(args=(input_ids,), kwargs={"max_new_tokens": new}, init_kwargs=config, state=state)

    return build


GREEDY = Graded(
    name="greedy_decode",
    clause="10.greedy_decode",
    task=6,
    kind="driver",
    driver="gpt:greedy",
    signature="greedy_decode(model, input_ids (B, L), max_new_tokens) -> tokens (B, L + max_new_tokens)",
    outputs=("tokens", "cached (1: the prompt once, then one token at a time with the cache)"),
    reference=ref.greedy_decode,
    forbidden=FORBIDDEN,
    variants=(
        Variant("no-kv-cache", _greedy_without_cache),
        *(Variant(mid, _gpt_variant(**knobs), replaces="GPT") for mid, knobs in DECODED_MISTAKES),
    ),
    dims=DECODER_DIMS,
    small=(
        _decoding_case(1, 1, 2, **SMALL_GPT),
        _decoding_case(1, 2, 2, **SMALL_GPT),
        _decoding_case(2, 2, 3, **SMALL_GPT),
        _decoding_case(1, 3, 2, **SMALL_GPT2),
        _decoding_case(2, 3, 3, **SMALL_GPT2),
    ),
    tests=(
        Test(
            "float32",
            torch.float32,
            points=0.5,
            hidden=False,
            cases=(Case("B=2, prompt of 4, 6 new tokens", _decoding_case(2, 4, 6)),),
        ),
        Test(
            "float64",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(Case("B=1, prompt of 3, 5 new tokens", _decoding_case(1, 3, 5)),),
        ),
        Test(
            "float64, to the last position",
            torch.float64,
            points=0.5,
            cases=(Case("B=3, prompt of 5, 15 new tokens (20 positions)", _decoding_case(3, 5, 15)),),
        ),
        Test(
            "float32, other configurations",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "1 layer, 1 head, B=2, prompt of 1, 1 new token",
                    _decoding_case(2, 1, 1, num_layers=1, num_heads=1),
                ),
                Case(
                    "3 layers, eps left out, B=4, prompt of 2, 9 new tokens",
                    _decoding_case(4, 2, 9, eps=None, num_layers=3),
                ),
            ),
        ),
    ),
)

# -- filter_logits --------------------------------------------------------------------------------

MARGIN = 1e-4  # every cumulative probability at least this far from top_p (CURRICULUM.md)


def _probabilities_before(logits: Tensor, temperature: float, top_k: int) -> Tensor:
    """For each token, in decreasing order of probability, the probability of the tokens
    before it, after the temperature and top-k (float64)."""
    filtered = ref.filter_logits(logits.double(), temperature, top_k)
    probs = filtered.softmax(-1).sort(-1, descending=True).values
    return probs.cumsum(-1) - probs


def _filter_case(
    b: int,
    v: int,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    scale: float = 2.0,
    ties: bool = False,
):
    """Random logits and the options given (the others left out, at their defaults).
    ``ties``: logits on a grid of halves, so that many are equal (graded with top-k only).
    Without ties, logits are drawn again until no two in a row are equal and every
    cumulative probability is MARGIN away from top_p."""
    options = {
        k: x for k, x in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if x is not None
    }

    def build(g, dtype):
        for _ in range(100):
            logits = randn(g, b, v, dtype=dtype, scale=scale)
            if ties:
                return CaseData(args=((logits * 2).round() / 2,), kwargs=options)
            distinct = all(row.unique().numel() == v for row in logits)
            before = _probabilities_before(logits, temperature or 1.0, top_k or 0)
            if distinct and (top_p is None or bool(((before - top_p).abs() >= MARGIN).all())):
                return CaseData(args=(logits,), kwargs=options)
        raise ValueError("no logits with a margin around top_p: change the case")

    return build


def _tempered_after_filtering(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Top-k and top-p on the untempered logits (top-p's softmax without the temperature),
    divided by the temperature afterwards."""
    return ref.filter_logits(logits, 1.0, top_k, top_p) / temperature


def _top_p_dropping_the_crossing_token(strict: bool):
    """Top-p keeping only the tokens whose own cumulative probability stays within top_p
    (``<= top_p``, or ``< top_p`` when ``strict``), the first always."""

    def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
        logits = ref.filter_logits(logits, temperature, top_k)
        if top_p < 1.0:
            probs, order = logits.softmax(-1).sort(-1, descending=True)
            total = probs.cumsum(-1)
            remove = total >= top_p if strict else total > top_p
            remove[..., 0] = False
            logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
        return logits

    return filter_logits


FILTER = Graded(
    name="filter_logits",
    clause="10.filter_logits",
    task=7,
    kind="driver",
    driver="gpt:filtered",
    signature="filter_logits(logits (B, V), temperature=1.0, top_k=0, top_p=1.0) -> logits (B, V), "
    "removed tokens at -inf",
    outputs=("kept (logits != -inf)", "logits (removed tokens shown as 0)"),
    reference=ref.filter_logits,
    variants=(
        Variant("temperature-after-softmax", _tempered_after_filtering),
        Variant("top-p-drops-crossing-token", _top_p_dropping_the_crossing_token(strict=False)),
        Variant("top-p-drops-crossing-token", _top_p_dropping_the_crossing_token(strict=True)),
    ),
    dims=(Dim("B", lambda c: c.args[0].shape[0]), Dim("V", lambda c: c.args[0].shape[1])),
    # one row of 3 or 4 logits, each option alone, then a temperature with top-p; then logits
    # up to |24| (a softmax without its max subtracted overflows float32 past 88 once tempered)
    small=(
        _filter_case(1, 3, temperature=0.5),
        _filter_case(1, 3, top_k=1),
        _filter_case(1, 3, top_p=0.5),
        _filter_case(1, 4, top_p=0.7),
        _filter_case(1, 4, temperature=2.0, top_p=0.6),
        _filter_case(1, 4, temperature=0.5, top_k=2),
        _filter_case(1, 3, temperature=0.25, top_p=0.9, scale=8.0),
    ),
    tests=(
        Test(
            "float32, one warper at a time",
            torch.float32,
            points=1,
            hidden=False,
            cases=(
                Case("temperature=0.7, B=2, V=10", _filter_case(2, 10, temperature=0.7)),
                Case("top_k=3, B=2, V=10", _filter_case(2, 10, top_k=3)),
                Case("top_p=0.9, B=3, V=12", _filter_case(3, 12, top_p=0.9)),
            ),
        ),
        Test(
            "float64, top-k's ties, a k beyond the vocabulary",
            torch.float64,
            points=1,
            hidden=False,
            cases=(
                Case(
                    "top_k=3, logits on a grid of halves (ties), B=3, V=12",
                    _filter_case(3, 12, top_k=3, ties=True),
                ),
                Case(
                    "top_k=100 > V=20, temperature=1.3, B=2", _filter_case(2, 20, temperature=1.3, top_k=100)
                ),
            ),
        ),
        Test(
            "float64, the three together",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "temperature=1.5, top_k=10, top_p=0.8, B=4, V=50",
                    _filter_case(4, 50, temperature=1.5, top_k=10, top_p=0.8),
                ),
                Case(
                    "temperature=0.5, top_k=20, top_p=0.95, B=3, V=50",
                    _filter_case(3, 50, temperature=0.5, top_k=20, top_p=0.95),
                ),
                Case(
                    "temperature=2.0, top_p=0.5, B=4, V=30", _filter_case(4, 30, temperature=2.0, top_p=0.5)
                ),
            ),
        ),
        Test(
            "float32, edges",
            torch.float32,
            points=1,
            cases=(
                Case(
                    "nothing given: the logits as they are, B=2, V=16, |logits|~8 (probabilities below "
                    "float32's epsilon: top-p's default removes none of them)",
                    _filter_case(2, 16, scale=8.0),
                ),
                Case("top_p=0.01: the most probable token only, B=3, V=20", _filter_case(3, 20, top_p=0.01)),
                Case("top_k=1, B=2, V=20", _filter_case(2, 20, top_k=1)),
                Case(
                    "temperature=3.0, top_p=0.3, B=4, V=25, |logits|~4",
                    _filter_case(4, 25, temperature=3.0, top_p=0.3, scale=4.0),
                ),
                Case(
                    "one token: B=3, V=1, temperature=0.5, top_k=1, top_p=0.5",
                    _filter_case(3, 1, temperature=0.5, top_k=1, top_p=0.5),
                ),
                Case(
                    "one row: B=1, V=16, temperature=0.8, top_p=0.9",
                    _filter_case(1, 16, temperature=0.8, top_p=0.9),
                ),
            ),
        ),
    ),
)

# -- sample ---------------------------------------------------------------------------------------


def _sample_variant(
    *, filter_logits=ref.filter_logits, tempering: str = "logits", seeded: bool = True, cache: bool = True
):
    """``sample`` with a knob per mistake: ``tempering`` "logits" (the reference), "divided
    probabilities" (softmax(...) / temperature: the draw ignores it) or "powered
    probabilities" (softmax(...) ** (1 / temperature): right but for top-p's nucleus);
    ``seeded``: the draw from ``generator`` or from the global RNG; ``cache``."""

    def sample(model, input_ids, max_new_tokens, generator, temperature=1.0, top_k=0, top_p=1.0):
        def draw(logits: Tensor) -> Tensor:
            if tempering == "logits":
                probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
            else:
                probs = filter_logits(logits, 1.0, top_k, top_p).softmax(-1)
                probs = (
                    probs / temperature
                    if tempering == "divided probabilities"
                    else probs ** (1 / temperature)
                )
            return torch.multinomial(probs, num_samples=1, generator=generator if seeded else None)

        return _decode(model, input_ids, max_new_tokens, draw, cache=cache)

    return sample


def _sampling_case(
    b: int,
    prompt: int,
    new: int,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    **overrides: int,
):
    options = {
        k: x for k, x in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if x is not None
    }

    def build(g, dtype):
        config, state = _model_case(_config(1e-5, overrides), g, dtype)
        input_ids = randint(g, 0, config["vocab_size"], b, prompt)
        seed = int(randint(g, 0, 2**31, 1))
        kwargs = {"max_new_tokens": new, "seed": seed, "options": options}
        return CaseData(args=(input_ids,), kwargs=kwargs, init_kwargs=config, state=state)

    return build


SAMPLE = Graded(
    name="sample",
    clause="10.sample",
    task=8,
    kind="driver",
    driver="gpt:sampled",
    signature="sample(model, input_ids (B, L), max_new_tokens, generator, temperature=1.0, top_k=0, "
    "top_p=1.0) -> tokens (B, L + max_new_tokens)",
    outputs=(
        "tokens",
        "cached (1: the prompt once, then one token at a time with the cache)",
        "generator_only (1: the same tokens under another global seed)",
    ),
    reference=ref.sample,
    forbidden=FORBIDDEN,
    variants=(
        Variant("temperature-after-softmax", _sample_variant(tempering="divided probabilities")),
        Variant("temperature-after-softmax", _sample_variant(tempering="powered probabilities")),
        Variant(
            "top-p-drops-crossing-token",
            _sample_variant(filter_logits=_top_p_dropping_the_crossing_token(strict=False)),
        ),
        Variant(
            "top-p-drops-crossing-token",
            _sample_variant(filter_logits=_top_p_dropping_the_crossing_token(strict=True)),
        ),
        Variant("sampling-ignores-generator", _sample_variant(seeded=False)),
        Variant("no-kv-cache", _sample_variant(cache=False)),
        *(Variant(mid, _gpt_variant(**knobs), replaces="GPT") for mid, knobs in DECODED_MISTAKES),
    ),
    dims=DECODER_DIMS,
    small=(
        _sampling_case(1, 1, 2, **SMALL_GPT),
        _sampling_case(1, 1, 3, temperature=2.0, **SMALL_GPT),
        _sampling_case(2, 1, 4, top_p=0.6, **SMALL_GPT),
        _sampling_case(2, 2, 3, temperature=0.5, top_k=2, **SMALL_GPT),
        # its own values only: with integer logits a cumulative probability can sit on the
        # top-p threshold itself, where the last bit (which differs between CPUs) decides
        own_values(_sampling_case(2, 3, 4, top_p=0.8, **SMALL_GPT2)),
        # and unfiltered, at every value level: two layers and a prompt of 3 show a future
        # that leaks into the last position's logits
        _sampling_case(2, 3, 4, **SMALL_GPT2),
        # top-k of 2 in a batch of one: a k taken from another axis than the vocabulary's
        _sampling_case(1, 1, 3, top_k=2, **SMALL_GPT),
    ),
    tests=(
        Test(
            "float32, plain sampling",
            torch.float32,
            points=1,
            hidden=False,
            cases=(Case("nothing filtered, B=2, prompt of 3, 6 new tokens", _sampling_case(2, 3, 6)),),
        ),
        Test(
            "float64, temperature, top-k and top-p",
            torch.float64,
            points=0.5,
            hidden=False,
            cases=(
                Case(
                    "temperature=0.8, top_k=10, top_p=0.9, B=3, prompt of 2, 8 new tokens",
                    _sampling_case(3, 2, 8, temperature=0.8, top_k=10, top_p=0.9),
                ),
            ),
        ),
        Test(
            "float64, one warper at a time",
            torch.float64,
            points=1,
            cases=(
                Case(
                    "temperature=2.0, B=4, prompt of 2, 6 new tokens",
                    _sampling_case(4, 2, 6, temperature=2.0),
                ),
                Case("top_p=0.6, B=4, prompt of 3, 6 new tokens", _sampling_case(4, 3, 6, top_p=0.6)),
                Case("top_k=1: greedy, B=2, prompt of 4, 4 new tokens", _sampling_case(2, 4, 4, top_k=1)),
                Case("top_k=5, B=1, prompt of 2, 1 new token", _sampling_case(1, 2, 1, top_k=5)),
            ),
        ),
        Test(
            "float32, all three, other configurations",
            torch.float32,
            points=0.5,
            cases=(
                Case(
                    "temperature=0.5, top_p=0.7, 3 layers, B=4, prompt of 1, 8 new tokens",
                    _sampling_case(4, 1, 8, temperature=0.5, top_p=0.7, num_layers=3),
                ),
                Case(
                    "temperature=1.5, top_k=20, top_p=0.8, 1 layer, 1 head, B=3, prompt of 5, 6 new tokens",
                    _sampling_case(3, 5, 6, temperature=1.5, top_k=20, top_p=0.8, num_layers=1, num_heads=1),
                ),
            ),
        ),
    ),
)

SPEC = StageSpec(
    id="10_gpt",
    title="A GPT decoder and generation",
    graded=(GELU_TANH, BLOCK, MODEL, LOSS, EXPORT, GREEDY, FILTER, SAMPLE),
    uses=("01_attention", "02_multihead"),
    call_timeout_s=10.0,
    misconceptions={
        "gelu-erf-instead-of-tanh": "your output matches the exact GELU, 0.5 * x * (1 + erf(x / sqrt(2))) "
        "(stage 06's, BERT's): GPT-2 uses the tanh approximation, 0.5 * x * (1 + tanh(sqrt(2 / pi) * "
        "(x + 0.044715 * x**3))), which differs from it by up to 5e-4; use gelu_tanh in the MLP.",
        "post-ln-instead-of-pre-ln": "your output matches a post-LN block (x = ln_1(x + attention(x)), as "
        "BERT's layer in stage 06): GPT-2 normalises each sub-layer's input and adds the sub-layer's "
        "output to the stream untouched: x = x + attention(ln_1(x)); out = x + mlp(ln_2(x)).",
        "no-causal-mask": "your output matches attention without the causal mask: every token sees the "
        "tokens after it, so the model reads the answer it should predict. Mask the scores with the last "
        "T rows of your 01 causal_mask(L_past + T).",
        "no-final-layernorm": "your logits match a model without the final LayerNorm: GPT-2 normalises "
        "the last block's output with ln_f before the output layer (pre-LN blocks leave the stream "
        "unnormalised), logits = ln_f(x) @ wte.weight.T.",
        "cache-positions-restart": "your output matches new tokens placed at positions from 0 when a past "
        "is given: with L_past cached positions, the new tokens are positions L_past ... L_past + T - 1, "
        "in the position embeddings (wpe(arange(L_past, L_past + T))) and in the causal mask (its last "
        "T rows, causal_mask(L_past + T)[L_past:]).",
        "labels-not-shifted": "your loss matches each position's prediction scored against the wrong "
        "token: position t predicts token t + 1, so compare logits[:, :-1] with labels[:, 1:] (the last "
        "position predicts nothing).",
        "conv1d-not-transposed": "your weights match nn.Linear's (out_features, in_features) layout: "
        "GPT-2's Conv1D computes x @ weight + bias and stores (in_features, out_features), so every "
        "projection's weight is transposed (.T), and c_attn is cat([w_q, w_k, w_v]).T, (d, 3d).",
        "no-kv-cache": "your tokens are right but your model ran the whole sequence at every step: call "
        "model(input_ids) once for the prompt, then model(new_token, past=present) for each new token "
        "(B, 1), with the present of the call before (the grader counts the calls of model(...)).",
        "temperature-after-softmax": "your output matches the temperature applied to probabilities, "
        "after a softmax: divide the logits by the temperature first, then take top-k and top-p (whose "
        "softmax must see the tempered logits), then the softmax for the draw.",
        "top-p-drops-crossing-token": "your output matches top-p without the token that crosses top_p: "
        "keep every token whose more probable tokens hold less than top_p in total, so the smallest set "
        "whose probability reaches top_p is kept, the crossing token included.",
        "sampling-ignores-generator": "your tokens match draws from the global random generator: pass "
        "the generator to every draw, torch.multinomial(probs, num_samples=1, generator=generator), and "
        "draw nothing else, so that the same generator state gives the same tokens.",
    },
)
