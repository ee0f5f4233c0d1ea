"""Models trained by `lstm train`, from Python: load, forward, evaluate, predict, metrics.

    import lstm_engine
    m = lstm_engine.Model("runs/demo")                 # a run folder or a model.safetensors
    y = m.forward(x, lengths)                          # numpy array or torch tensor in, the same kind out
    r = lstm_engine.evaluate("runs/demo")              # `lstm eval`'s numbers, as a dict
    lstm_engine.predict("runs/demo", "new.csv", "out.csv")
    rows = lstm_engine.read_metrics("runs/demo")       # metrics.jsonl, one dict per line
"""

import ctypes
import json
import os

from . import _lib

__all__ = ["Model", "evaluate", "predict", "read_metrics"]

_DEVICES = {"cpu": _lib.CPU, "cuda": _lib.CUDA}


def _device(d):
    d = str(d)
    base = d.split(":")[0]
    if base not in _DEVICES:
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {d!r}")
    return _DEVICES[base]


def _enc(s):
    return s.encode() if s is not None else None


class Model:
    """A trained model on a device. forward() runs the network (the state_dict's function):
    tokens (int64 [T, B]) or features (float [T, B, F]) in, the last layer's output out ([T, B, K]
    for per-step models, [B, K] for many-to-one), without the task's pre/post-processing
    (normalisation of regression inputs, softmax): predict() does those."""

    def __init__(self, path, device="cpu", precision="f32", algo="auto"):
        lib = _lib.lib()
        out = ctypes.c_void_p()
        _lib.check(lib.lstm_model_load(_enc(os.fspath(path)), _device(device), _enc(precision), _enc(algo),
                                       ctypes.byref(out)))
        self._ptr = out.value
        info = lib.lstm_model_info(self._ptr)
        if info is None:
            _lib.check(1)
        self.info = json.loads(_lib.text(info))
        self.path = self.info["path"]
        self.task = self.info["task"]
        self.metadata = self.info["metadata"]
        self.input_kind = self.info["input"]["kind"]
        self.num_features = self.info["input"]["features"]

    def close(self):
        if getattr(self, "_ptr", None):
            p, self._ptr = self._ptr, None
            _lib.lib().lstm_model_destroy(p)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def classes(self):
        c = self.metadata.get("lstm_engine.classes")
        return json.loads(c) if c else None

    @property
    def normalization(self):
        """regress/forecast: the training split's statistics ({"inputs": {"names", "mean", "std"} or
        None, "targets": {...}}) that forward's inputs and outputs are standardised with; else None."""
        n = self.metadata.get("lstm_engine.normalization")
        return json.loads(n) if n else None

    def forward(self, x, lengths=None):
        """x: a numpy array or a (CPU) torch tensor, sequence-major ([T, B] token ids or
        [T, B, F] features); lengths: B values in [1, T] or None. Returns the output as the same
        kind (numpy float32 array or torch float32 tensor)."""
        is_torch = type(x).__module__.startswith("torch")
        if is_torch:
            import torch

            t = x.detach().cpu().contiguous()
            if t.dtype not in (torch.int64, torch.float32, torch.float64):
                t = t.float() if t.is_floating_point() else t.long()
            dt = {torch.int64: _lib.I64, torch.float32: _lib.F32, torch.float64: _lib.F64}[t.dtype]
            ptr, shape = t.data_ptr(), tuple(t.shape)
            keep = t
        else:
            import numpy as np

            a = np.asarray(x)
            if a.dtype.kind in "iu":
                a = a.astype(np.int64, copy=False)
            elif a.dtype not in (np.float32, np.float64):
                a = a.astype(np.float32)
            a = np.ascontiguousarray(a)
            dt = _lib.I64 if a.dtype == np.int64 else (_lib.F32 if a.dtype == np.float32 else _lib.F64)
            ptr, shape = a.ctypes.data, a.shape
            keep = a
        sh = (ctypes.c_int64 * len(shape))(*shape)
        lens = None
        if lengths is not None:
            lv = [int(v) for v in (lengths.tolist() if hasattr(lengths, "tolist") else lengths)]
            lens = (ctypes.c_int64 * len(lv))(*lv)
        out = ctypes.c_void_p()
        lib = _lib.lib()
        _lib.check(lib.lstm_model_forward(self._ptr, ctypes.c_void_p(ptr), dt, sh, len(shape), lens,
                                          ctypes.byref(out)))
        del keep
        try:
            nd = lib.lstm_tensor_ndim(out)
            oshape = tuple(lib.lstm_tensor_dim(out, i) for i in range(nd))
            n = 1
            for d in oshape:
                n *= d
            buf = (ctypes.c_float * n).from_address(lib.lstm_tensor_data(out)) if n else (ctypes.c_float * 0)()
            if is_torch:
                import torch

                return torch.frombuffer(bytearray(buf), dtype=torch.float32).reshape(oshape) if n else \
                    torch.zeros(oshape)
            import numpy as np

            return np.frombuffer(bytes(buf), dtype=np.float32).reshape(oshape).copy()
        finally:
            lib.lstm_tensor_destroy(out)

    __call__ = forward


def evaluate(model, data=None, batch_size=0, seq_len=0, device="cpu", precision="f32", algo="auto"):
    """`lstm eval`: the model (a file or run folder) on `data` (None: the held-out split it was
    trained with). Returns EvalResult's JSON as a dict (loss, accuracy, count, task, and per task
    e.g. per-class metrics, macro_f1, confusion, or mse/mae/rmse)."""
    out = ctypes.c_char_p()
    _lib.check(_lib.lib().lstm_evaluate(_enc(os.fspath(model)), _enc(os.fspath(data)) if data else None,
                                        int(batch_size), int(seq_len), _device(device), _enc(precision), _enc(algo),
                                        ctypes.byref(out)))
    return json.loads(_lib.text(out.value))


def predict(model, data, output=None, format=None, top_k=5, batch_size=64, device="cpu",  # noqa: A002
            precision="f32", algo="auto"):
    """`lstm predict`: writes predictions for `data` to `output` (a path) and returns the summary
    dict {task, format, rows, unknown}; with output None, returns (summary, text) instead."""
    res = ctypes.c_char_p()
    txt = ctypes.c_char_p()
    _lib.check(_lib.lib().lstm_predict(_enc(os.fspath(model)), _enc(os.fspath(data)),
                                       _enc(os.fspath(output)) if output else None, _enc(format), int(top_k),
                                       int(batch_size), _device(device), _enc(precision), _enc(algo),
                                       ctypes.byref(res), ctypes.byref(txt)))
    summary = json.loads(_lib.text(res.value))
    return summary if output else (summary, _lib.text(txt.value))


def read_metrics(run, kind=None):
    """The lines of a run folder's metrics.jsonl (the file training appends to), as dicts; kind:
    only those of that kind ("train", "eval", "early_stop", "non_finite")."""
    path = os.fspath(run)
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a half-written last line of a run in progress
            if kind is None or r.get("kind") == kind:
                rows.append(r)
    return rows
