"""Shared helpers of the Python package's tests (pytest; scripts/test.sh's `python` part)."""

import json
import os
import struct
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))

# Algo::Auto's choices go to a file of the test run's own, not the user's cache.
os.environ.setdefault("LSTM_AUTO_CACHE", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"lstm_engine_pytest_auto_{os.getpid()}.json"))

import lstm_engine  # noqa: E402
from lstm_engine import _lib  # noqa: E402

CUDA = torch.cuda.is_available() and _lib.cuda_available()
CUDA_REASON = ("no GPU: torch.cuda.is_available() is False" if not torch.cuda.is_available() else
               "the engine cannot use the GPU: " + (_lib.text(_lib.lib().lstm_cuda_unavailable_reason()) or "?"))
needs_cuda = pytest.mark.skipif(not CUDA, reason=CUDA_REASON)

# DESIGN.md's tolerances: relative L2 error against a float64 reference.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, "tf32": 1e-3, torch.bfloat16: 2e-2, torch.float16: 2e-2}

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16,
              "F16": torch.float16, "I32": torch.int32, "U8": torch.uint8}


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file (no dependency on the safetensors package)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        buf = bytearray(raw[base + b:base + e])
        t = torch.frombuffer(buf, dtype=_ST_DTYPES[h["dtype"]]) if e > b else torch.empty(0, dtype=_ST_DTYPES[h["dtype"]])
        out[name] = t.reshape(h["shape"]).clone()
    return out, meta


def rel_l2(a, ref):
    a = a.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    den = ref.norm().item()
    num = (a - ref).norm().item()
    return num / den if den > 0 else num


def engine_bin():
    """The `lstm` program next to the loaded liblstm_c (a build tree), or $LSTM_ENGINE_BIN."""
    env = os.environ.get("LSTM_ENGINE_BIN")
    if env:
        return env
    p = os.path.join(os.path.dirname(_lib.path()), "lstm")
    return p if os.path.exists(p) else None
