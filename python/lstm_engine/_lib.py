"""Loads liblstm_c (the engine's C API, include/lstm/c_api.h) through ctypes.

Where the library is looked for, first found wins:
  1. $LSTM_ENGINE_LIB: the path of a liblstm_c.so (or of the folder holding it);
  2. the copy bundled inside this package by `pip install ./python` (lstm_engine/lib/);
  3. the build trees of the repository this package sits in (python/../build-cpu, build, ...).
liblstm_c.so finds liblstm.so next to itself (RPATH $ORIGIN).
"""

import ctypes
import json
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int32, c_int64, c_size_t,
                    c_uint64, c_void_p)

_NAME = "liblstm_c.so"
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
BUILD_DIRS = ("build-cpu", "build", "build-asan")

# enum lstm_dtype / lstm_device
F64, F32, BF16, F16, I64, I32, U8 = range(7)
CPU, CUDA = 0, 1


class LstmError(RuntimeError):
    """An error from the engine: its message is lstm::Error's (what was expected, what was given)."""


class Spec(Structure):
    _fields_ = [("input_size", c_int64), ("hidden_size", c_int64), ("num_layers", c_int64), ("proj_size", c_int64),
                ("bidirectional", c_int32), ("bias", c_int32), ("batch_first", c_int32), ("dropout", c_double)]


class BackendOptions(Structure):
    _fields_ = [("algo", c_char_p), ("cudnn_algo", c_char_p), ("cuda_graphs", c_char_p), ("auto_cache", c_char_p),
                ("allow_tf32", c_int32)]


ALLOC_FN = CFUNCTYPE(c_void_p, c_void_p, c_size_t, c_void_p)
FREE_FN = CFUNCTYPE(None, c_void_p, c_void_p)


class Allocator(Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("ctx", c_void_p)]


class ForwardArgs(Structure):
    _fields_ = [("steps", c_int64), ("batch", c_int64), ("x", c_void_p), ("lengths", POINTER(c_int64)),
                ("h0", c_void_p), ("c0", c_void_p), ("weights", POINTER(c_void_p)), ("num_weights", c_int64),
                ("training", c_int32), ("seed", c_uint64), ("output", c_void_p), ("h_n", c_void_p),
                ("c_n", c_void_p), ("stream", c_void_p), ("allocator", POINTER(Allocator))]


class BackwardArgs(Structure):
    _fields_ = [("weights", POINTER(c_void_p)), ("num_weights", c_int64), ("d_output", c_void_p),
                ("d_h_n", c_void_p), ("d_c_n", c_void_p), ("d_x", c_void_p), ("d_h0", c_void_p), ("d_c0", c_void_p),
                ("d_weights", POINTER(c_void_p)), ("stream", c_void_p), ("allocator", POINTER(Allocator))]


def candidates():
    """The paths tried, in order (for error messages and `python -m lstm_engine`)."""
    out = []
    env = os.environ.get("LSTM_ENGINE_LIB")
    if env:
        out.append(os.path.join(env, _NAME) if os.path.isdir(env) else env)
    out.append(os.path.join(_HERE, "lib", _NAME))
    for d in BUILD_DIRS:
        out.append(os.path.join(_REPO, d, _NAME))
    return out


_lock = threading.Lock()
_lib = None
_path = None


def _declare(lib):
    def f(name, res, *args):
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = list(args)

    f("lstm_c_api_version", c_int)
    f("lstm_version", c_char_p)
    f("lstm_last_error", c_char_p)
    f("lstm_cuda_available", c_int)
    f("lstm_cuda_unavailable_reason", c_char_p)
    f("lstm_backends_json", c_char_p)
    f("lstm_spec_param_names", c_int, POINTER(Spec), POINTER(c_char_p), POINTER(c_int64))
    f("lstm_backend_create", c_int, POINTER(Spec), c_int, c_int, c_int, POINTER(BackendOptions), POINTER(c_void_p))
    f("lstm_backend_destroy", None, c_void_p)
    f("lstm_backend_info", c_char_p, c_void_p, c_char_p)
    f("lstm_backend_flat_layout", c_int, c_void_p, POINTER(c_size_t), POINTER(c_size_t), c_int64)
    f("lstm_backend_forward", c_int, c_void_p, POINTER(ForwardArgs), POINTER(c_void_p))
    f("lstm_backend_backward", c_int, c_void_p, c_void_p, POINTER(BackwardArgs))
    f("lstm_saved_destroy", None, c_void_p)
    f("lstm_model_load", c_int, c_char_p, c_int, c_char_p, c_char_p, POINTER(c_void_p))
    f("lstm_model_destroy", None, c_void_p)
    f("lstm_model_info", c_char_p, c_void_p)
    f("lstm_model_forward", c_int, c_void_p, c_void_p, c_int, POINTER(c_int64), c_int64, POINTER(c_int64),
      POINTER(c_void_p))
    f("lstm_tensor_ndim", c_int64, c_void_p)
    f("lstm_tensor_dim", c_int64, c_void_p, c_int64)
    f("lstm_tensor_dtype", c_int, c_void_p)
    f("lstm_tensor_data", c_void_p, c_void_p)
    f("lstm_tensor_destroy", None, c_void_p)
    f("lstm_evaluate", c_int, c_char_p, c_char_p, c_int64, c_int64, c_int, c_char_p, c_char_p, POINTER(c_char_p))
    f("lstm_predict", c_int, c_char_p, c_char_p, c_char_p, c_char_p, c_int64, c_int64, c_int, c_char_p, c_char_p,
      POINTER(c_char_p), POINTER(c_char_p))


def lib():
    """The loaded library (loaded on first use). Raises OSError naming every path tried."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for p in candidates():
            if not os.path.exists(p):
                tried.append(f"{p} (absent)")
                continue
            try:
                handle = ctypes.CDLL(p)
            except OSError as e:
                tried.append(f"{p} ({e})")
                continue
            _declare(handle)
            v = handle.lstm_c_api_version()
            if v != 1:
                tried.append(f"{p} (C API version {v}, this package speaks 1)")
                continue
            _lib, _path = handle, p
            return _lib
        raise OSError("lstm_engine: cannot load liblstm_c.so; build it (cmake --build build-cpu --target lstm_c) or "
                      "set LSTM_ENGINE_LIB to its path. Tried: " + "; ".join(tried))


def path():
    lib()
    return _path


def check(status):
    """Raises LstmError with the engine's message when status is not LSTM_OK."""
    if status != 0:
        raise LstmError(lib().lstm_last_error().decode("utf-8", "replace"))


def text(p):
    return p.decode("utf-8", "replace") if p is not None else None


def backends():
    """The backend registry of the loaded library: a list of dicts (name, algo, summary, ...)."""
    return json.loads(text(lib().lstm_backends_json()))


def cuda_available():
    return bool(lib().lstm_cuda_available())


def version():
    return text(lib().lstm_version())
