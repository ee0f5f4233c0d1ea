#!/usr/bin/env python3
"""Golden files for the LSTM op: PyTorch nn.LSTM forward and backward, stored as safetensors.

Usage (from anywhere; needs torch and safetensors):
    python3 scripts/make_fixtures.py [--out DIR]

Writes DIR/lstm_<case>.safetensors (default DIR: tests/fixtures next to this script's repo root)
and DIR/README.md. tests/test_lstm_fixtures.cpp replays every file through our backends.

Each file holds
  - every nn.LSTM state_dict tensor under its own name (weight_ih_l0, ..., weight_hr_l1_reverse),
  - "input" exactly as given to nn.LSTM ([T, B, I], or [B, T, I] when batch_first), with NaN
    at every step past a sequence's length,
  - optional "lengths" (int64 [B]) and "h0" / "c0",
  - "output" (zero past each length), "h_n", "c_n",
  - the cotangents "r_output", "r_h_n", "r_c_n" of the scalar loss
        loss = sum(output * r_output) + sum(h_n * r_h_n) + sum(c_n * r_c_n),
  - the gradients of that loss: "grad_input", "grad_h0", "grad_c0" (when h0/c0 are given) and
    "grad.<name>" for every parameter.
__metadata__ records the LSTM's configuration, the dtype and the torch version.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

F64 = torch.float64
F32 = torch.float32

# Small on purpose: the files are committed, and every size stays below T<=7, B<=4, H<=5, I<=4.
# Each case differs from the plainest one in the features its name says.
CASES = [
    dict(name="uni_l1", I=3, H=4, L=1, T=5, B=3),
    dict(name="uni_l3", I=3, H=4, L=3, T=5, B=3, h0=True),
    dict(name="bi_l1", I=3, H=4, L=1, bi=True, T=5, B=3),
    dict(name="bi_l3", I=3, H=4, L=3, bi=True, T=6, B=3, h0=True),
    dict(name="proj_uni_l2", I=3, H=5, P=3, L=2, T=6, B=3, h0=True),
    dict(name="proj_bi_l2", I=4, H=5, P=2, L=2, bi=True, T=6, B=3, h0=True),
    dict(name="proj_bi_l2_varlen", I=4, H=5, P=3, L=2, bi=True, T=6, B=4, lengths=[6, 2, 1, 4]),
    dict(name="batch_first_uni_l2", I=3, H=4, L=2, bf=True, T=5, B=3, h0=True),
    dict(name="batch_first_bi_varlen", I=3, H=4, L=2, bi=True, bf=True, T=6, B=3, lengths=[3, 6, 1]),
    # Packed input whose lengths all equal T must match the unpacked computation.
    dict(name="equal_lengths_packed_bi_l2", I=3, H=4, L=2, bi=True, T=5, B=3, lengths=[5, 5, 5], h0=True),
    dict(name="varlen_uni_l1", I=3, H=4, L=1, T=7, B=4, lengths=[7, 1, 4, 2]),
    dict(name="varlen_uni_l2_h0", I=3, H=4, L=2, T=7, B=4, lengths=[2, 7, 1, 5], h0=True),
    dict(name="varlen_bi_l2_h0", I=3, H=4, L=2, bi=True, T=7, B=4, lengths=[3, 7, 1, 5], h0=True),
    dict(name="input_gt_hidden", I=4, H=2, L=2, T=5, B=2, h0=True),
    dict(name="input_lt_hidden_bi", I=1, H=5, L=2, bi=True, T=4, B=2),
    dict(name="nobias_uni_l2", I=3, H=4, L=2, bias=False, T=5, B=3, h0=True),
    dict(name="nobias_bi_proj_varlen", I=3, H=5, P=2, L=2, bi=True, bias=False, T=6, B=3, lengths=[6, 1, 3]),
    dict(name="combined", I=4, H=5, P=3, L=3, bi=True, bf=True, T=7, B=4, lengths=[5, 1, 7, 3], h0=True),
    # The float32 set: made and stored in float32, replayed in float32.
    dict(name="f32_uni_l1", I=3, H=4, L=1, T=5, B=3, dtype=F32),
    dict(name="f32_bi_l2_varlen_h0", I=3, H=4, L=2, bi=True, T=7, B=4, lengths=[3, 7, 1, 5], h0=True, dtype=F32),
    dict(name="f32_combined", I=4, H=5, P=3, L=3, bi=True, bf=True, T=7, B=4, lengths=[5, 1, 7, 3], h0=True,
         dtype=F32),
]

BASE_SEED = 20240611


def dtype_name(dt):
    return {F64: "F64", F32: "F32"}[dt]


def full_case(c):
    d = dict(P=0, bi=False, bf=False, bias=True, lengths=None, h0=False, dtype=F64)
    d.update(c)
    assert d["T"] <= 7 and d["B"] <= 4 and d["H"] <= 5 and d["I"] <= 4, d["name"]
    if d["lengths"] is not None:
        assert len(d["lengths"]) == d["B"] and all(1 <= n <= d["T"] for n in d["lengths"]), d["name"]
    return d


def past_length_mask(c):
    """Bool mask of the input's shape: True at steps past each sequence's length."""
    T, B, I = c["T"], c["B"], c["I"]
    m = torch.zeros(T, B, I, dtype=torch.bool)
    if c["lengths"] is not None:
        for b, n in enumerate(c["lengths"]):
            m[n:, b, :] = True
    return m.transpose(0, 1).contiguous() if c["bf"] else m


def run_lstm(lstm, c, x, hx):
    """nn.LSTM on x (packed when the case has lengths); returns padded output, h_n, c_n."""
    if c["lengths"] is None:
        out, (h_n, c_n) = lstm(x, hx)
        return out, h_n, c_n
    lengths = torch.tensor(c["lengths"], dtype=torch.int64)
    packed = pack_padded_sequence(x, lengths, batch_first=c["bf"], enforce_sorted=False)
    out_p, (h_n, c_n) = lstm(packed, hx)
    out, _ = pad_packed_sequence(out_p, batch_first=c["bf"], total_length=c["T"])
    return out, h_n, c_n


def forward_backward(lstm, c, x_value, h0_value, c0_value, cot):
    """One forward and backward from fresh leaves; returns outputs and gradients (detached)."""
    x = x_value.clone().requires_grad_(True)
    leaves = [x]
    hx = None
    if h0_value is not None:
        h0 = h0_value.clone().requires_grad_(True)
        c0 = c0_value.clone().requires_grad_(True)
        hx = (h0, c0)
        leaves += [h0, c0]
    out, h_n, c_n = run_lstm(lstm, c, x, hx)
    if cot is None:
        # Drawn after the forward so their shapes come from what nn.LSTM returned.
        cot = (torch.randn_like(out), torch.randn_like(h_n), torch.randn_like(c_n))
    loss = (out * cot[0]).sum() + (h_n * cot[1]).sum() + (c_n * cot[2]).sum()
    names = [n for n, _ in lstm.named_parameters()]
    params = [p for _, p in lstm.named_parameters()]
    grads = torch.autograd.grad(loss, leaves + params)
    res = {"output": out, "h_n": h_n, "c_n": c_n, "grad_input": grads[0]}
    if hx is not None:
        res["grad_h0"] = grads[1]
        res["grad_c0"] = grads[2]
    for n, g in zip(names, grads[len(leaves):]):
        res["grad." + n] = g
    return {k: v.detach() for k, v in res.items()}, cot


def make_case(c, index):
    c = full_case(c)
    dt = c["dtype"]
    torch.manual_seed(BASE_SEED + index)
    lstm = torch.nn.LSTM(input_size=c["I"], hidden_size=c["H"], num_layers=c["L"], bias=c["bias"],
                         batch_first=c["bf"], dropout=0.0, bidirectional=c["bi"], proj_size=c["P"])
    lstm = lstm.to(dt)
    lstm.train()  # dropout is 0, so train() only matters for matching the C++ side's training=true
    D = 2 if c["bi"] else 1
    Hout = c["P"] if c["P"] > 0 else c["H"]
    shape = (c["B"], c["T"], c["I"]) if c["bf"] else (c["T"], c["B"], c["I"])
    x_finite = torch.randn(*shape, dtype=dt)
    h0 = c0 = None
    if c["h0"]:
        h0 = 0.5 * torch.randn(c["L"] * D, c["B"], Hout, dtype=dt)
        c0 = 0.5 * torch.randn(c["L"] * D, c["B"], c["H"], dtype=dt)

    res, cot = forward_backward(lstm, c, x_finite, h0, c0, None)

    pad = past_length_mask(c)
    x_stored = x_finite.clone()
    if pad.any():
        x_stored[pad] = float("nan")
        # The packed path never reads past a length: the NaN-poisoned input must give the very
        # same numbers, bit for bit, as the finite one.
        res_nan, _ = forward_backward(lstm, c, x_stored, h0, c0, cot)
        for k, v in res.items():
            if not torch.equal(v, res_nan[k]):
                sys.exit(f"{c['name']}: '{k}' differs when the input past the lengths is NaN")
        res = res_nan
        if not torch.all(res["grad_input"][pad] == 0):
            sys.exit(f"{c['name']}: grad_input is not zero past the lengths")
        # pad_packed_sequence pads the output with zeros.
        out_pad = past_length_mask(dict(c, I=D * Hout))
        if not torch.all(res["output"][out_pad] == 0):
            sys.exit(f"{c['name']}: output is not zero past the lengths")
    for k, v in res.items():
        if not torch.isfinite(v).all():
            sys.exit(f"{c['name']}: '{k}' has non-finite values")

    tensors = {n: p.detach() for n, p in lstm.state_dict().items()}
    tensors["input"] = x_stored
    if c["lengths"] is not None:
        tensors["lengths"] = torch.tensor(c["lengths"], dtype=torch.int64)
    if h0 is not None:
        tensors["h0"] = h0
        tensors["c0"] = c0
    tensors["r_output"], tensors["r_h_n"], tensors["r_c_n"] = cot
    tensors.update(res)
    for k, v in tensors.items():
        assert v.dtype == (torch.int64 if k == "lengths" else dt), (c["name"], k, v.dtype)
    # save_file refuses views that share storage; each tensor gets its own contiguous copy.
    tensors = {k: v.contiguous().clone() for k, v in tensors.items()}

    meta = {
        "case": c["name"],
        "input_size": str(c["I"]),
        "hidden_size": str(c["H"]),
        "num_layers": str(c["L"]),
        "bidirectional": "1" if c["bi"] else "0",
        "proj_size": str(c["P"]),
        "batch_first": "1" if c["bf"] else "0",
        "bias": "1" if c["bias"] else "0",
        "dtype": dtype_name(dt),
        "seq_len": str(c["T"]),
        "batch": str(c["B"]),
        "seed": str(BASE_SEED + index),
        "torch": torch.__version__,
        "generator": "scripts/make_fixtures.py",
    }
    return c, tensors, meta


def describe(c):
    parts = [f"I={c['I']}", f"H={c['H']}", f"layers={c['L']}"]
    if c["P"]:
        parts.append(f"proj={c['P']}")
    if c["bi"]:
        parts.append("bidirectional")
    if c["bf"]:
        parts.append("batch_first")
    if not c["bias"]:
        parts.append("bias=False")
    parts.append(f"T={c['T']}")
    parts.append(f"B={c['B']}")
    if c["lengths"] is not None:
        parts.append("lengths=" + ",".join(str(n) for n in c["lengths"]))
    if c["h0"]:
        parts.append("h0/c0")
    return ", ".join(parts)


def write_readme(out_dir, written):
    lines = [
        "# LSTM golden files",
        "",
        "Made by `python3 scripts/make_fixtures.py` (from the repository root) with",
        f"torch {torch.__version__} and safetensors, on the CPU, from fixed seeds (base seed {BASE_SEED}).",
        "Regenerate with the same command; `tests/test_lstm_fixtures.cpp` replays every",
        "`lstm_*.safetensors` here through our reference backend and compares every number.",
        "",
        "Each file: the nn.LSTM `state_dict` tensors under their own names; `input` as given to",
        "nn.LSTM (NaN at steps past each length); optional `lengths` (int64), `h0`, `c0`; `output`",
        "(zero past each length), `h_n`, `c_n`; the cotangents `r_output`, `r_h_n`, `r_c_n` of",
        "`loss = sum(output*r_output) + sum(h_n*r_h_n) + sum(c_n*r_c_n)`; and that loss's gradients",
        "`grad_input`, `grad_h0`, `grad_c0`, `grad.<parameter name>`. Variable lengths go through",
        "`pack_padded_sequence(enforce_sorted=False)` and `pad_packed_sequence(total_length=T)`; the",
        "script checks that the NaN-poisoned input gives bit-identical results to a finite one.",
        "`__metadata__` holds input_size, hidden_size, num_layers, bidirectional, proj_size,",
        "batch_first, bias (\"1\"/\"0\"), dtype (F64/F32), seq_len, batch, seed and the torch version.",
        "",
        "| file | dtype | configuration |",
        "|---|---|---|",
    ]
    for c, fname in written:
        lines.append(f"| `{fname}` | {dtype_name(c['dtype'])} | {describe(c)} |")
    lines.append("")
    (out_dir / "README.md").write_text("\n".join(lines))


def main():
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=repo / "tests" / "fixtures")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # One thread and no oneDNN: the plain ATen LSTM path, the same numbers on every machine.
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    written = []
    for i, case in enumerate(CASES):
        c, tensors, meta = make_case(case, i)
        fname = f"lstm_{c['name']}.safetensors"
        path = args.out / fname
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
        written.append((c, fname))
        print(f"wrote {path} ({path.stat().st_size} bytes): {describe(c)}")
    write_readme(args.out, written)
    print(f"wrote {args.out / 'README.md'}")


if __name__ == "__main__":
    main()
