#!/usr/bin/env python3
"""Ours -> PyTorch: a model trained by `lstm train` loads into the equivalent PyTorch module with
load_state_dict(strict=True), and PyTorch's nn.LSTM on those weights gives what `lstm forward`
gives. (PyTorch -> ours is tests/test_model_fixtures.cpp and the golden LSTM fixtures.)

  python3 scripts/check_torch_interop.py path/to/lstm [--work DIR]
Exit status 0 when every check passes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn


def module_from_description(desc):
    """The PyTorch module whose state_dict names equal our Model's parameter names."""
    net = nn.Module()
    features = desc["input"]["features"]
    for layer in desc["layers"]:
        kind, name = layer["type"], layer["name"]
        if kind == "embedding":
            setattr(net, name, nn.Embedding(layer["num_embeddings"], layer["embedding_dim"]))
            features = layer["embedding_dim"]
        elif kind == "lstm":
            m = nn.LSTM(features, layer["hidden_size"], num_layers=layer["num_layers"],
                        bidirectional=layer["bidirectional"], proj_size=layer["proj_size"], bias=layer["bias"])
            setattr(net, name, m)
            features = (2 if layer["bidirectional"] else 1) * (layer["proj_size"] or layer["hidden_size"])
        elif kind == "dense":
            setattr(net, name, nn.Linear(features, layer["out_features"], bias=layer["bias"]))
            features = layer["out_features"]
    return net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lstm", help="path of the lstm program")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="lstm_interop_")
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        for i in range(300):
            f.write(f"a line of text number {i}, with some words in it.\n")
    cfg = {"task": "charlm", "data": {"path": text},
           "model": {"embedding_dim": 8, "layers": [
               {"type": "lstm", "hidden_size": 24, "num_layers": 2, "bidirectional": True, "proj_size": 12},
               {"type": "dense", "out_features": 16}, {"type": "activation", "fn": "tanh"}, {"type": "dense"}]},
           "train": {"steps": 30, "batch_size": 8, "seq_len": 16, "eval_every": 0, "checkpoint_every": 0,
                     "sample_length": 0}}
    with open(os.path.join(work, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    run = os.path.join(work, "run")
    subprocess.run([args.lstm, "train", "--config", os.path.join(work, "cfg.json"), "--out", run], check=True,
                   stdout=subprocess.DEVNULL)
    model_file = os.path.join(run, "model.safetensors")
    with safe_open(model_file, "pt") as f:
        desc = json.loads(f.metadata()["lstm_engine.model"])
    sd = load_file(model_file)
    net = module_from_description(desc).float()
    net.load_state_dict(sd, strict=True)  # raises on any missing/unexpected name or shape
    print(f"strict load_state_dict of {len(sd)} tensors into PyTorch: ok")

    # The LSTM part, through `lstm forward`, against nn.LSTM on the same weights.
    lstm_name = next(l["name"] for l in desc["layers"] if l["type"] == "lstm")
    lstm = getattr(net, lstm_name)
    lstm_sd = {k[len(lstm_name) + 1:]: v for k, v in sd.items() if k.startswith(lstm_name + ".")}
    save_file(lstm_sd, os.path.join(work, "m.safetensors"))
    torch.manual_seed(0)
    T, B = 9, 3
    x = torch.randn(T, B, lstm.input_size)
    lengths = torch.tensor([9, 5, 2])
    save_file({"input": x, "lengths": lengths}, os.path.join(work, "x.safetensors"))
    subprocess.run([args.lstm, "forward", "--model", os.path.join(work, "m.safetensors"), "--input",
                    os.path.join(work, "x.safetensors"), "--output", os.path.join(work, "y.safetensors")], check=True)
    ours = load_file(os.path.join(work, "y.safetensors"))
    with torch.no_grad():
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, (h, c) = lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=T)
    ok = True
    for name, ref in (("output", out), ("h_n", h), ("c_n", c)):
        err = ((ours[name].double() - ref.double()).norm() / ref.double().norm()).item()
        good = err < 1e-5
        ok &= good
        print(f"lstm forward vs nn.LSTM {name}: relative error {err:.2e} {'ok' if good else 'FAILED'}")
    print("interop:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
