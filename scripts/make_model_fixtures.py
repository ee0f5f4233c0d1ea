#!/usr/bin/env python3
"""Golden files for whole models: PyTorch modules (Embedding / LSTM / Linear as attributes)
saved with safetensors.torch.save_file(model.state_dict()), with inputs and PyTorch's outputs.
tests/test_model_fixtures.cpp loads them into lstm-engine Models and compares.

Run where torch and safetensors are installed:  python3 scripts/make_model_fixtures.py
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Tagger(nn.Module):
    """Tokens -> per-step logits (language modelling / tagging)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(11, 5)
        self.lstm = nn.LSTM(5, 7, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(14, 11)

    def forward(self, tokens, lengths):
        e = self.embedding(tokens)
        packed = pack_padded_sequence(e, lengths, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, total_length=tokens.shape[0])
        return self.fc(out)


class Classifier(nn.Module):
    """Feature sequences -> one label from the last layer's h_n (both directions)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, num_layers=2, bidirectional=True, proj_size=3)
        self.fc = nn.Linear(6, 5)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.fc(torch.cat([h_n[-2], h_n[-1]], dim=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    args = ap.parse_args()
    torch.manual_seed(1234)
    meta = {"torch": torch.__version__}

    tagger = Tagger().double()
    tokens = torch.randint(0, 11, (6, 3))
    lengths = torch.tensor([6, 4, 1])
    with torch.no_grad():
        logits = tagger(tokens, lengths)
    save_file({k: v.contiguous() for k, v in tagger.state_dict().items()},
              os.path.join(args.out, "model_tagger.safetensors"), metadata=meta)
    save_file({"tokens": tokens.contiguous(), "lengths": lengths, "logits": logits.contiguous()},
              os.path.join(args.out, "model_tagger_io.safetensors"), metadata=meta)

    clf = Classifier().double()
    x = torch.randn(7, 4, 4, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 1, 5])
    with torch.no_grad():
        logits = clf(x, lengths)
    save_file({k: v.contiguous() for k, v in clf.state_dict().items()},
              os.path.join(args.out, "model_classifier.safetensors"), metadata=meta)
    save_file({"input": x.contiguous(), "lengths": lengths, "logits": logits.contiguous()},
              os.path.join(args.out, "model_classifier_io.safetensors"), metadata=meta)
    print("wrote model fixtures to", os.path.abspath(args.out))


if __name__ == "__main__":
    main()
