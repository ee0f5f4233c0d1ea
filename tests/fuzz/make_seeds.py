#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (tests/fuzz/corpus/<target>/): small valid inputs that reach
each parser's paths (every dtype, metadata, quoted CSV fields, multi-byte UTF-8, every optimizer
and schedule), from which libFuzzer mutates. Run from anywhere; rewrites the folders."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def safetensors(tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)} -> the file's bytes."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def seeds_safetensors():
    f32 = struct.pack("<6f", 0.5, -1, 2, 3.25, 0, -0.0)
    return {
        "f32_2x3.safetensors": safetensors({"w": ("F32", [2, 3], f32)}),
        "every_dtype.safetensors": safetensors({
            "a": ("F64", [2], struct.pack("<2d", 1.5, -2)),
            "b": ("F32", [1], struct.pack("<f", 3)),
            "c": ("BF16", [2], b"\x80\x3f\x00\x40"),
            "d": ("F16", [2], b"\x00\x3c\x00\xc0"),
            "e": ("I64", [3], struct.pack("<3q", 1, -1, 7)),
            "f": ("I32", [2], struct.pack("<2i", 5, -5)),
            "g": ("U8", [4], bytes([0, 1, 254, 255])),
        }, metadata={"format": "pt", "hidden_size": "4"}),
        "scalar_and_empty.safetensors": safetensors({
            "s": ("F32", [], struct.pack("<f", 1)),
            "z": ("F32", [0, 4], b""),
        }),
        "metadata_only.safetensors": safetensors({}, metadata={"config": "{\"task\":\"charlm\"}"}),
        "empty_header.safetensors": safetensors({}),
    }


def seeds_config():
    classify = {"task": "classify", "data": {"path": "data.csv", "valid_fraction": 0.1},
                "model": {"layers": [{"type": "lstm", "hidden_size": 64, "num_layers": 2, "bidirectional": True},
                                     {"type": "last_step"}, {"type": "dense", "out_features": 32},
                                     {"type": "activation", "fn": "relu"}, {"type": "dense"}]},
                "train": {"steps": 500, "batch_size": 32, "optimizer": {"type": "adamw"},
                          "schedule": {"type": "cosine", "lr": 0.003, "warmup_steps": 20}}}
    charlm = {"task": "charlm", "data": {"path": "corpus.txt", "max_bytes": 100000},
              "model": {"embedding_dim": 16,
                        "layers": [{"type": "lstm", "hidden_size": 32, "proj_size": 16, "dropout": 0.1},
                                   {"type": "dropout", "p": 0.2}, {"type": "dense"}]},
              "train": {"steps": 10, "seq_len": 16, "seed": 3, "clip_grad_norm": 0,
                        "optimizer": {"type": "sgd", "momentum": 0.9, "nesterov": True},
                        "schedule": {"type": "step", "lr": 0.1, "step_size": 5, "gamma": 0.5}}}
    tagger = {"task": "classify", "data": {"path": "d.csv", "label_column": "y", "sequence_column": "x"},
              "model": {"layers": [{"type": "lstm", "hidden_size": 8, "output": "h_n", "bias": False},
                                   {"type": "dense", "out_features": 3, "bias": False}]},
              "train": {"optimizer": {"type": "adam", "beta1": 0.8, "weight_decay": 0.01},
                        "schedule": {"type": "constant", "lr": 0.01}, "threads": 1}}
    return {
        "classify.json": json.dumps(classify, indent=1).encode(),
        "charlm.json": json.dumps(charlm).encode(),
        "tagger.json": json.dumps(tagger).encode(),
        "minimal.json": b'{"task": "charlm", "data": {"path": "x"}}',
    }


def seeds_csv():
    return {
        "numeric.csv": b"label,sequence\n0,1 2 3\n1,4.5 -6 7e-3\n0,0.25\n",
        "features.csv": b"id,label,sequence\n1,2,1|2 3|4 5|6\n2,0,0|0\n",
        "tokens.csv": b"label,sequence\nspam,buy now cheap\nham,see you at noon\nspam,\"free, really\"\n",
        "quoted_bom_crlf.csv": b"\xef\xbb\xbf\"label\",\"sequence\"\r\n\"1\",\"1 2\"\r\n\"0\",\"3 \"\"4\"\"\"\r\n",
        "multiline_quote.csv": b"label,sequence,note\n0,1 2,\"two\nlines\"\n1,3,\n",
    }


def seeds_corpus():
    return {
        "ascii.txt": b"The quick brown fox jumps over the lazy dog.\n" * 3,
        "utf8.txt": "Größe, naïve café; \u65e5\u672c\u8a9e; emoji \U0001F600 and \u00e9\u0301.\n".encode() * 2,
        "fortune.txt": b"%\nA fortune a day keeps the doctor away.\n%\nYou will write a fuzzer.\n%\n",
        "short.txt": b"ab",
    }


def main():
    for target, files in (("safetensors", seeds_safetensors()), ("config", seeds_config()),
                          ("csv", seeds_csv()), ("corpus", seeds_corpus())):
        d = os.path.join(CORPUS, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(files)} seeds")


if __name__ == "__main__":
    main()
