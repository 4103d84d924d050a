"""Mistakes held-out real submissions made, named by the ids whose text covers them (issue 26):
10's `conv1d-not-transposed` in its literal form (every nn.Linear weight exported as it is,
c_attn concatenated along dim 1) and its partial forms, and 11's `backbone-not-frozen` for a
backbone frozen in part (the layers but not the embeddings, ...). Each student form below is
written as students write it, not as the variant that names it, and run through the stage's
own driver and checks (tests/support.named_mistakes); the correct forms are named nothing."""

from __future__ import annotations

import pytest
import torch

from autograder.grader.plan import StagePlan
from autograder.stages import load_spec
from tests.support import named_mistakes


def _namespace(stage: str) -> dict:
    """The reference's names of ``stage`` and of the stages it uses, as a notebook defines them."""
    spec = load_spec(stage)
    stages = (*(load_spec(s) for s in spec.uses), spec)
    return {g.name: g.reference for s in stages for g in s.graded}


# -- 10: to_gpt2_state_dict --------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_plan():
    return StagePlan.build(load_spec("10_gpt"), "cpu")


def _export(c_attn, transpose_others: bool | tuple[str, ...]):
    """A student's to_gpt2_state_dict: ``c_attn(w_q, w_k, w_v)`` builds c_attn's weight from
    the nn.Linear weights; ``transpose_others``: which of w_o, c_fc, c_proj get their .T."""
    names = ("w_o", "c_fc", "c_proj")
    transposed = names if transpose_others is True else transpose_others or ()

    def to_gpt2_state_dict(model):
        d = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight}
        for i, block in enumerate(model.h):
            p = f"transformer.h.{i}."
            attn, mlp = block.attn, block.mlp
            linears = {"w_o": attn.w_o.weight, "c_fc": mlp.c_fc.weight, "c_proj": mlp.c_proj.weight}
            w = {k: (v.t() if k in transposed else v) for k, v in linears.items()}
            d[p + "ln_1.weight"], d[p + "ln_1.bias"] = block.ln_1.weight, block.ln_1.bias
            d[p + "attn.c_attn.weight"] = c_attn(attn.w_q.weight, attn.w_k.weight, attn.w_v.weight)
            d[p + "attn.c_attn.bias"] = torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias])
            d[p + "attn.c_proj.weight"], d[p + "attn.c_proj.bias"] = w["w_o"], attn.w_o.bias
            d[p + "ln_2.weight"], d[p + "ln_2.bias"] = block.ln_2.weight, block.ln_2.bias
            d[p + "mlp.c_fc.weight"], d[p + "mlp.c_fc.bias"] = w["c_fc"], mlp.c_fc.bias
            d[p + "mlp.c_proj.weight"], d[p + "mlp.c_proj.bias"] = w["c_proj"], mlp.c_proj.bias
        d["transformer.ln_f.weight"], d["transformer.ln_f.bias"] = model.ln_f.weight, model.ln_f.bias
        d["lm_head.weight"] = model.wte.weight
        return d

    return to_gpt2_state_dict


def _as_linear_stores_them_along_columns(q, k, v):
    return torch.cat([q, k, v], dim=1)


def _as_linear_stores_them_as_rows(q, k, v):
    return torch.cat([q, k, v])


def _each_transposed_as_rows(q, k, v):
    return torch.cat([q.T, k.T, v.T])


def _right_c_attn(q, k, v):
    return torch.cat([q.T, k.T, v.T], dim=1)


def _right_c_attn_transposed_after(q, k, v):
    return torch.cat([q, k, v], dim=0).t().contiguous()


EXPORT_MISTAKES = {
    # the literal form: every nn.Linear weight as it is, c_attn along dim 1
    "every weight as it is, c_attn along dim 1": _export(_as_linear_stores_them_along_columns, False),
    "every weight as it is, c_attn stacked": _export(_as_linear_stores_them_as_rows, False),
    "c_attn along dim 1 untransposed, the others transposed": _export(
        _as_linear_stores_them_along_columns, True
    ),
    "c_attn right, the others as they are": _export(_right_c_attn, False),
    "c_attn right, the MLP as it is": _export(_right_c_attn, ("w_o",)),
    "c_attn of transposed blocks stacked as rows, the others transposed": _export(
        _each_transposed_as_rows, True
    ),
    "c_attn along dim 1, w_o transposed, the MLP as it is": _export(
        _as_linear_stores_them_along_columns, ("w_o",)
    ),
    "only c_proj of the MLP left as it is": _export(_right_c_attn, ("w_o", "c_fc")),
}


@pytest.mark.parametrize("form", EXPORT_MISTAKES)
def test_10_every_untransposed_export_is_named_conv1d_not_transposed(gpt_plan, form):
    ns = {**_namespace("10_gpt"), "to_gpt2_state_dict": EXPORT_MISTAKES[form]}
    failed, named = named_mistakes(gpt_plan, ns, "to_gpt2_state_dict")
    assert failed, form
    assert named == {"conv1d-not-transposed"}, (form, named)


@pytest.mark.parametrize("c_attn", [_right_c_attn, _right_c_attn_transposed_after])
def test_10_a_right_export_is_named_nothing(gpt_plan, c_attn):
    ns = {**_namespace("10_gpt"), "to_gpt2_state_dict": _export(c_attn, True)}
    assert named_mistakes(gpt_plan, ns, "to_gpt2_state_dict") == (0, set())


# -- 11: freeze_backbone -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def transfer_plan():
    return StagePlan.build(load_spec("11_transfer"), "cpu")


def _encoder_layers_only(model):
    for layer in model.bert.layers:
        for p in layer.parameters():
            p.requires_grad = False


def _layers_by_name(model):
    for name, p in model.named_parameters():
        if name.startswith("bert.layers"):
            p.requires_grad = False


def _layers_module_list(model):
    model.bert.layers.requires_grad_(False)


def _embedding_tables_and_layers(model):
    emb = model.bert.embeddings
    for table in (emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings):
        table.weight.requires_grad = False
    model.bert.layers.requires_grad_(False)


def _word_embeddings(model):
    model.bert.embeddings.word_embeddings.weight.requires_grad = False


def _all_but_the_last_layer(model):
    model.bert.embeddings.requires_grad_(False)
    for layer in model.bert.layers[:-1]:
        layer.requires_grad_(False)


def _weights_only(model):
    for name, p in model.bert.named_parameters():
        if "weight" in name:
            p.requires_grad = False


def _matrices_only(model):
    for p in model.bert.parameters():
        if p.ndim == 2:
            p.requires_grad = False


def _attribute_set_on_the_module(model):
    model.bert.requires_grad = False  # an attribute: freezes nothing


FREEZE_MISTAKES = {
    "the encoder layers, embeddings left trainable": _encoder_layers_only,
    "bert.layers by name, embeddings left trainable": _layers_by_name,
    "the layers' ModuleList, embeddings left trainable": _layers_module_list,
    "the embedding tables and the layers, the embeddings' LayerNorm left trainable": _embedding_tables_and_layers,
    "the word embeddings only": _word_embeddings,
    "all but the last layer": _all_but_the_last_layer,
    "parameters named weight, biases left trainable": _weights_only,
    "matrices, biases and LayerNorms left trainable": _matrices_only,
    "model.bert.requires_grad = False": _attribute_set_on_the_module,
}


@pytest.mark.parametrize("form", FREEZE_MISTAKES)
def test_11_a_backbone_frozen_in_part_is_named_backbone_not_frozen(transfer_plan, form):
    ns = {**_namespace("11_transfer"), "freeze_backbone": FREEZE_MISTAKES[form]}
    failed, named = named_mistakes(transfer_plan, ns, "freeze_backbone")
    assert failed, form
    assert named == {"backbone-not-frozen"}, (form, named)


def _every_bert_parameter(model):
    for p in model.bert.parameters():
        p.requires_grad = False


def _bert_by_name(model):
    for name, p in model.named_parameters():
        if name.startswith("bert."):
            p.requires_grad_(False)


def _embeddings_and_layers(model):
    model.bert.embeddings.requires_grad_(False)
    model.bert.layers.requires_grad_(False)


@pytest.mark.parametrize("freeze", [_every_bert_parameter, _bert_by_name, _embeddings_and_layers])
def test_11_a_whole_frozen_backbone_is_named_nothing(transfer_plan, freeze):
    ns = {**_namespace("11_transfer"), "freeze_backbone": freeze}
    assert named_mistakes(transfer_plan, ns, "freeze_backbone") == (0, set())
