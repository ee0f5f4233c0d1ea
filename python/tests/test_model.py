"""lstm_engine.Model / evaluate / predict / read_metrics on a model trained by `lstm train`,
checked against the `lstm` program and against the same network rebuilt in PyTorch."""

import json
import os
import random
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

from conftest import engine_bin, needs_cuda, read_safetensors, rel_l2
import lstm_engine
from lstm_engine import LstmError

LSTM_BIN = engine_bin()
pytestmark = pytest.mark.skipif(LSTM_BIN is None, reason="no `lstm` program next to liblstm_c (build the lstm_cli "
                                                          "target, or set LSTM_ENGINE_BIN)")


def cli(*args):
    r = subprocess.run([LSTM_BIN, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"lstm {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def write_majority_csv(path, rows, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("id,sequence,label\n")
        for r in range(rows):
            steps = [rng.choice("abc") for _ in range(rng.randint(3, 12))]
            na, nb = steps.count("a"), steps.count("b")
            if na == nb:
                steps.append("a")
                na += 1
            f.write(f"{r},{' '.join(steps)},{'more_a' if na > nb else 'more_b'}\n")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    write_majority_csv(d / "train.csv", 200, 3)
    write_majority_csv(d / "test.csv", 40, 4)
    cfg = {"task": "classify",
           "data": {"path": str(d / "train.csv"), "valid_fraction": 0.3},
           "model": {"embedding_dim": 8,
                     "layers": [{"type": "lstm", "hidden_size": 16, "num_layers": 2, "bidirectional": True,
                                 "output": "h_n"}, {"type": "dense"}]},
           "train": {"steps": 40, "batch_size": 16, "eval_every": 20, "eval_batches": 0, "log_every": 10,
                     "checkpoint_every": 0}}
    (d / "cls.json").write_text(json.dumps(cfg))
    cli("train", "--threads", "1", "--config", str(d / "cls.json"), "--out", str(d / "run"))
    return d


def torch_twin(path):
    """The model's network rebuilt from its state_dict in plain PyTorch (nn.LSTM)."""
    sd, meta = read_safetensors(path)
    arch = json.loads(meta["lstm_engine.model"])
    layers = arch["layers"]
    assert [l["type"] for l in layers] == ["embedding", "lstm", "dense"], layers
    emb = nn.Embedding(*sd["embedding.weight"].shape)
    lstm_sd = {k[len("lstm."):]: v for k, v in sd.items() if k.startswith("lstm.")}
    H = lstm_sd["weight_hh_l0"].shape[1]
    lstm = nn.LSTM(emb.embedding_dim, H, num_layers=2, bidirectional=True)
    fc = nn.Linear(sd["fc.weight"].shape[1], sd["fc.weight"].shape[0])
    emb.load_state_dict({"weight": sd["embedding.weight"]})
    lstm.load_state_dict(lstm_sd)
    fc.load_state_dict({"weight": sd["fc.weight"], "bias": sd["fc.bias"]})

    def f(tokens, lengths):
        x = emb(tokens)
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.as_tensor(lengths), enforce_sorted=False)
        _, (h, _) = lstm(packed)
        return fc(torch.cat([h[-2], h[-1]], dim=1))  # last layer, both directions (forward first)

    return f


def test_model_info(run_dir):
    m = lstm_engine.Model(run_dir / "run")
    assert m.task == "classify"
    assert m.input_kind == "tokens"
    assert m.classes == ["more_a", "more_b"]
    assert m.path.endswith("model.safetensors")
    assert m.info["output"]["features"] == 2
    assert "lstm_engine.config" in m.metadata


def test_forward_matches_pytorch_twin(run_dir):
    m = lstm_engine.Model(run_dir / "run")
    tokens = json.loads(m.metadata["lstm_engine.tokens"])
    ids = {t: i for i, t in enumerate(tokens["tokens"] if isinstance(tokens, dict) else tokens)}
    seqs = [["a", "b", "a"], ["b"] * 7, ["c", "a", "b", "b", "a"]]
    T = max(len(s) for s in seqs)
    x = np.zeros((T, len(seqs)), dtype=np.int64)
    for b, s in enumerate(seqs):
        x[:len(s), b] = [ids[t] for t in s]
    lengths = [len(s) for s in seqs]
    y = m.forward(x, lengths)
    assert isinstance(y, np.ndarray) and y.shape == (3, 2) and y.dtype == np.float32
    want = torch_twin(m.path)(torch.from_numpy(x), lengths).detach()
    assert rel_l2(torch.from_numpy(y), want) < 1e-5
    yt = m.forward(torch.from_numpy(x), torch.tensor(lengths))
    assert isinstance(yt, torch.Tensor) and torch.equal(yt, torch.from_numpy(y))
    with pytest.raises(LstmError, match="this model reads tokens"):
        m.forward(np.zeros((T, 3, 4), dtype=np.float32))


def test_evaluate_same_as_cli(run_dir):
    r = lstm_engine.evaluate(run_dir / "run", run_dir / "test.csv")
    c = json.loads(cli("eval", "--model", str(run_dir / "run"), "--data", str(run_dir / "test.csv"), "--json"))
    assert r["task"] == "classify" and r["count"] == 40
    assert r["loss"] == pytest.approx(c["loss"], rel=1e-12)
    assert r["accuracy"] == c["accuracy"]
    assert r["confusion"] == c["confusion"]
    assert r["macro_f1"] == pytest.approx(c["macro_f1"], rel=1e-12)
    held = lstm_engine.evaluate(run_dir / "run")
    assert held["count"] == 60


def test_predict_same_as_cli(run_dir, tmp_path):
    summary, text = lstm_engine.predict(run_dir / "run", run_dir / "test.csv")
    assert summary == {"task": "classify", "format": "csv", "rows": 40, "unknown": 0}
    assert text == cli("predict", "--model", str(run_dir / "run"), "--data", str(run_dir / "test.csv"))
    out = tmp_path / "p.jsonl"
    s2 = lstm_engine.predict(run_dir / "run", run_dir / "test.csv", out)
    assert s2["format"] == "jsonl" and s2["rows"] == 40
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first["probabilities"]) == {"more_a", "more_b"}


def test_read_metrics(run_dir):
    rows = lstm_engine.read_metrics(run_dir / "run")
    train = [r for r in rows if r["kind"] == "train"]
    evals = lstm_engine.read_metrics(run_dir / "run", kind="eval")
    assert [r["step"] for r in train] == [10, 20, 30, 40]
    assert [r["step"] for r in evals] == [20, 40]
    best = [r for r in evals if r["best"]][-1]
    # The final model is the best one; evaluating it on its held-out split gives the logged loss.
    assert lstm_engine.evaluate(run_dir / "run")["loss"] == pytest.approx(best["valid_loss"], rel=1e-6)


def test_errors(tmp_path):
    with pytest.raises(LstmError, match="does not exist"):
        lstm_engine.Model(tmp_path / "nothing.safetensors")
    with pytest.raises(LstmError, match="precision"):
        lstm_engine.Model(tmp_path / "nothing.safetensors", precision="f13")


@needs_cuda
def test_forward_cuda_matches_cpu(run_dir):
    cpu = lstm_engine.Model(run_dir / "run")
    gpu = lstm_engine.Model(run_dir / "run", device="cuda")
    x = np.array([[0, 1, 2], [1, 1, 0], [2, 0, 1]], dtype=np.int64)
    assert rel_l2(torch.from_numpy(gpu.forward(x)), torch.from_numpy(cpu.forward(x))) < 1e-5
    r1 = lstm_engine.evaluate(run_dir / "run", run_dir / "test.csv")
    r2 = lstm_engine.evaluate(run_dir / "run", run_dir / "test.csv", device="cuda")
    assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-4)


def test_module_main_lists_the_library_and_backends():
    r = subprocess.run([__import__("sys").executable, "-m", "lstm_engine"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(__import__("sys").path)})
    assert r.returncode == 0, r.stderr
    assert lstm_engine._lib.path() in r.stdout
    assert "  reference " in r.stdout
