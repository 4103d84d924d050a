"""The stage 10 reference against code nobody here wrote: transformers' GPT2LMHeadModel (its
logits, its cache, its loss), its generate (greedy and sampling) and its logits warpers,
on small random configurations, in float64 and float32. The weights go from our module
to GPT-2's with the reference's own to_gpt2_state_dict, loaded with strict=True."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import reference

ref = reference.load("10_gpt")
pytestmark = pytest.mark.stage10

transformers = pytest.importorskip("transformers")
logits_process = pytest.importorskip("transformers.generation.logits_process")

DTYPES = [torch.float32, torch.float64]
# Two correct programs differ by rounding only: float64 ~1e-15 on logits of magnitude ~5;
# float32 ~1e-6. The bounds leave room for that and for nothing a mistake does.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}

CONFIGS = {  # vocab, hidden, layers, heads, intermediate, positions
    "2 layers, 4 heads": (50, 16, 2, 4, 64, 32),
    "1 layer, 1 head": (23, 8, 1, 1, 20, 12),
    "3 layers, d_k = 1": (40, 6, 3, 6, 24, 16),
}


def _pair(config: tuple[int, ...], dtype: torch.dtype, seed: int, eps: float = 1e-5):
    """Our GPT with random weights (LayerNorm gains near 1), and transformers' GPT-2 with
    those weights, mapped by to_gpt2_state_dict."""
    vocab, hidden, layers, heads, inner, positions = config
    torch.manual_seed(seed)
    ours = ref.GPT(vocab, hidden, layers, heads, inner, positions, eps=eps).to(dtype).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.normal_(
                1.0 if "ln_" in name and name.endswith("weight") else 0.0, 0.3 if "ln_" in name else 0.5
            )
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_inner=inner,
        layer_norm_epsilon=eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,  # no end of sequence: generate runs max_new_tokens steps
        pad_token_id=0,
        attn_implementation="eager",  # the textbook attention, as ours (sdpa agrees within rounding)
    )
    theirs = transformers.GPT2LMHeadModel(config).to(dtype).eval()
    theirs.load_state_dict(ref.to_gpt2_state_dict(ours), strict=True)
    return ours, theirs


def _ids(config, B: int, L: int, seed: int) -> torch.Tensor:
    return torch.randint(0, config[0], (B, L), generator=torch.Generator().manual_seed(seed))


def _report(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    print(f"{what}: max abs diff {(got.double() - want.double()).abs().max().item():.1e}")


# -- gelu_tanh ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 4.0, 50.0])
def test_gelu_tanh_equals_transformers_gelu_new_and_torch_tanh_gelu(scale, dtype):
    x = torch.randn(3, 401, dtype=dtype, generator=torch.Generator().manual_seed(0)) * scale
    from transformers.activations import ACT2FN

    _report(f"gelu_tanh {dtype}", ref.gelu_tanh(x), ACT2FN["gelu_new"](x))
    torch.testing.assert_close(ref.gelu_tanh(x), ACT2FN["gelu_new"](x), **TOL[dtype])
    torch.testing.assert_close(ref.gelu_tanh(x), F.gelu(x, approximate="tanh"), **TOL[dtype])


def test_gelu_tanh_is_not_the_exact_gelu():
    """06's erf form differs by ~5e-4: far more than float32's rounding, so the mistake shows."""
    x = torch.linspace(-6, 6, 10001, dtype=torch.float64)
    diff = (ref.gelu_tanh(x) - F.gelu(x)).abs().max().item()
    assert 1e-4 < diff < 1e-3, diff


# -- the model, its cache ----------------------------------------------------------------


def test_to_gpt2_state_dict_has_exactly_gpt2s_keys_and_shapes():
    ours, theirs = _pair(CONFIGS["2 layers, 4 heads"], torch.float64, seed=0)
    mapped = ref.to_gpt2_state_dict(ours)
    want = theirs.state_dict()
    assert list(mapped) == list(want)  # the same keys, in GPT-2's own order
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in want.items()}
    # Conv1D stores (in, out): c_fc's weight is (hidden, intermediate), the transpose of nn.Linear's
    assert mapped["transformer.h.0.mlp.c_fc.weight"].shape == (16, 64)
    assert theirs.lm_head.weight is theirs.transformer.wte.weight  # GPT-2 ties them too


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_cache_equal_gpt2(name, dtype):
    config = CONFIGS[name]
    ours, theirs = _pair(config, dtype, seed=1)
    ids = _ids(config, 3, config[5] - 2, seed=2)
    with torch.no_grad():
        logits, present = ours(ids)
        out = theirs(ids, use_cache=True)
    assert logits.shape == (3, ids.size(1), config[0]) and logits.dtype == dtype
    _report(f"logits {name} {dtype}", logits, out.logits)
    torch.testing.assert_close(logits, out.logits, **TOL[dtype])
    layers, heads, d_k = config[2], config[3], config[1] // config[3]
    assert present.shape == (3, layers, 2, heads, ids.size(1), d_k)
    for i, layer in enumerate(out.past_key_values.layers):
        torch.testing.assert_close(present[:, i, 0], layer.keys, **TOL[dtype])
        torch.testing.assert_close(present[:, i, 1], layer.values, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunks", [[9, 1, 1, 1], [1] * 12, [4, 3, 5]], ids=str)
def test_the_cache_equals_recomputing_the_prefix_and_gpt2s_cache(chunks, dtype):
    """Chunk by chunk, each call with the cache of the one before: the logits of every
    position are those of one call on the whole sequence, and those of GPT-2 fed the same
    chunks with its own cache."""
    config = CONFIGS["2 layers, 4 heads"]
    ours, theirs = _pair(config, dtype, seed=3)
    ids = _ids(config, 2, sum(chunks), seed=4)
    with torch.no_grad():
        whole, whole_present = ours(ids)
        pieces, past, their_pieces, their_past = [], None, [], None
        for chunk in ids.split(chunks, dim=1):
            logits, past = ours(chunk, past=past)
            pieces.append(logits)
            out = theirs(chunk, past_key_values=their_past, use_cache=True)
            their_pieces.append(out.logits)
            their_past = out.past_key_values
    incremental = torch.cat(pieces, dim=1)
    _report(f"cache vs whole prefix {chunks} {dtype}", incremental, whole)
    torch.testing.assert_close(incremental, whole, **TOL[dtype])
    torch.testing.assert_close(past, whole_present, **TOL[dtype])
    _report(f"cache vs GPT-2's cache {chunks} {dtype}", incremental, torch.cat(their_pieces, dim=1))
    torch.testing.assert_close(incremental, torch.cat(their_pieces, dim=1), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_block_equals_gpt2s_block_with_a_past(dtype):
    """One block alone, given a past of its own: GPT2Block with the same weights and cache."""
    from transformers.cache_utils import DynamicCache

    config = CONFIGS["2 layers, 4 heads"]
    ours, theirs = _pair(config, dtype, seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 16, dtype=torch.float64, generator=g).to(dtype)
    past = torch.randn(2, 2, 4, 5, 4, dtype=torch.float64, generator=g).to(dtype)  # (B, 2, h, L_past, d_k)
    cache = DynamicCache(config=theirs.config)
    cache.update(past[:, 0].clone(), past[:, 1].clone(), layer_idx=0)
    # GPT-2's block takes its causal mask from the model: the last 3 rows of an (8, 8) one
    mask = torch.zeros(8, 8, dtype=dtype).masked_fill(~torch.ones(8, 8).tril().bool(), torch.finfo(dtype).min)
    with torch.no_grad():
        out, present = ours.h[0](x, past)
        their_out = theirs.transformer.h[0](x, past_key_values=cache, attention_mask=mask[None, None, 5:])
    their_out = their_out[0] if isinstance(their_out, tuple) else their_out
    _report(f"block with a past {dtype}", out, their_out)
    torch.testing.assert_close(out, their_out, **TOL[dtype])
    torch.testing.assert_close(present[:, 0], cache.layers[0].keys, **TOL[dtype])
    torch.testing.assert_close(present[:, 1], cache.layers[0].values, **TOL[dtype])


# -- the loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_equals_gpt2s_with_shifted_labels_and_ignored_ones(dtype):
    config = CONFIGS["2 layers, 4 heads"]
    ours, theirs = _pair(config, dtype, seed=7)
    ids = _ids(config, 3, 10, seed=8)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt that costs nothing
    labels[2, 7] = -100
    with torch.no_grad():
        logits, _ = ours(ids)
        loss = ref.causal_lm_loss(logits, labels)
        theirs_loss = theirs(ids, labels=labels).loss
    assert loss.dim() == 0 and loss.dtype == dtype
    _report(f"loss {dtype}", loss, theirs_loss)
    # transformers computes its loss in float32 whatever the model's dtype
    torch.testing.assert_close(loss.float(), theirs_loss, rtol=1e-6, atol=1e-6)
    # ... so in float64, the same formula by hand: -log p(token t+1 | tokens <= t), mean over counted pairs
    logp = logits[:, :-1].log_softmax(-1)
    target = labels[:, 1:]
    counted = target != -100
    by_hand = -logp.gather(-1, target.clamp_min(0)[..., None])[..., 0][counted].mean()
    torch.testing.assert_close(loss, by_hand, **TOL[dtype])


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_decode_equals_generate_without_sampling(name, dtype):
    config = CONFIGS[name]
    ours, theirs = _pair(config, dtype, seed=9)
    ids = _ids(config, 3, 4, seed=10)
    n = config[5] - 4
    with torch.no_grad():
        got = ref.greedy_decode(ours, ids, n)
        want = theirs.generate(ids, do_sample=False, max_new_tokens=n, attention_mask=torch.ones_like(ids))
    assert got.dtype == torch.int64 and got.shape == (3, 4 + n)
    assert torch.equal(got, want)


def _warpers(temperature: float, top_k: int, top_p: float):
    """transformers' warpers as generate builds them (GenerationMixin._get_logits_processor)."""
    out = []
    if temperature != 1.0:
        out.append(logits_process.TemperatureLogitsWarper(temperature))
    if top_k != 0:
        out.append(logits_process.TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        out.append(logits_process.TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return logits_process.LogitsProcessorList(out)


SETTINGS = [  # temperature, top_k, top_p
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.0, 5, 1.0),
    (1.0, 0, 0.9),
    (1.0, 0, 0.3),
    (1.0, 0, 0.01),  # only the most probable token: min_tokens_to_keep = 1
    (1.5, 10, 0.8),
    (0.5, 3, 0.95),
    (2.0, 100, 0.5),  # top_k beyond the vocabulary keeps all
    (1.0, 1, 1.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_filter_logits_equals_transformers_warpers(temperature, top_k, top_p, dtype):
    g = torch.Generator().manual_seed(11)
    for scale in (0.5, 2.0, 6.0):
        logits = (torch.randn(8, 50, dtype=torch.float64, generator=g) * scale).to(dtype)
        got = ref.filter_logits(logits, temperature, top_k, top_p)
        want = _warpers(temperature, top_k, top_p)(None, logits)
        assert got.dtype == dtype
        assert torch.equal(got == float("-inf"), want == float("-inf")), (scale, temperature, top_k, top_p)
        kept = want != float("-inf")
        torch.testing.assert_close(got[kept], want[kept], **TOL[dtype])


def test_top_k_keeps_ties_with_the_kth_logit_as_transformers_does():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0, 2.0]], dtype=torch.float64)
    got = ref.filter_logits(logits, top_k=2)
    want = _warpers(1.0, 2, 1.0)(None, logits)
    assert torch.equal(got, want)
    assert int((got > float("-inf")).sum()) == 4  # 3.0 and the three 2.0s


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    got = ref.filter_logits(probs.log(), top_p=0.7)
    want = _warpers(1.0, 0, 0.7)(None, probs.log())
    assert torch.equal(got == float("-inf"), want == float("-inf"))
    assert (got > float("-inf")).tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.8


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sample_equals_generate_with_sampling_seeded_alike(temperature, top_k, top_p):
    """transformers draws one torch.multinomial per step from the global RNG; ours from the
    generator, seeded alike: the same tokens. (transformers casts the logits to float32.)"""
    config = CONFIGS["2 layers, 4 heads"]
    ours, theirs = _pair(config, torch.float32, seed=12)
    ids = _ids(config, 4, 5, seed=13)
    n = 20
    for seed in (0, 1, 2):
        with torch.no_grad():
            got = ref.sample(ours, ids, n, torch.Generator().manual_seed(seed), temperature, top_k, top_p)
            torch.manual_seed(seed)
            want = theirs.generate(
                ids,
                do_sample=True,
                max_new_tokens=n,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                attention_mask=torch.ones_like(ids),
            )
        assert torch.equal(got, want), (seed, got, want)


def test_sample_depends_on_the_generator_alone():
    config = CONFIGS["2 layers, 4 heads"]
    ours, _ = _pair(config, torch.float64, seed=14)
    ids = _ids(config, 3, 4, seed=15)
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        with torch.no_grad():
            runs.append(ref.sample(ours, ids, 10, torch.Generator().manual_seed(7), 1.3, 8, 0.9))
    assert torch.equal(runs[0], runs[1])
    with torch.no_grad():
        other = ref.sample(ours, ids, 10, torch.Generator().manual_seed(8), 1.3, 8, 0.9)
    assert not torch.equal(runs[0], other)


def test_temperature_moves_the_nucleus():
    """Top-p is taken after the temperature: the nucleus of softmax(logits / T) differs from
    softmax(logits)'s, which is what temperature-after-softmax gets wrong."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]], dtype=torch.float64)
    cold = ref.filter_logits(logits, temperature=0.5, top_p=0.8)
    hot = ref.filter_logits(logits, temperature=2.0, top_p=0.8)
    assert int((cold > -math.inf).sum()) < int((hot > -math.inf).sum())
