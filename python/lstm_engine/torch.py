"""lstm_engine.torch.LSTM: a drop-in replacement for torch.nn.LSTM that runs on lstm-engine.

    from lstm_engine.torch import LSTM
    lstm = LSTM(64, 128, num_layers=2, batch_first=True).cuda()   # the constructor of nn.LSTM
    out, (h_n, c_n) = lstm(x)                                      # its forward, tensors or PackedSequence

Parameters have nn.LSTM's names and shapes, so state_dicts load both ways (strict=True). Autograd
goes through the engine's forward and backward. CUDA tensors are used in place on PyTorch's
current stream; CPU tensors go through the CPU backends. docs/guide/python.md has the details and
the limits.
"""

import ctypes
import math
import threading
import warnings

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from . import _lib
from ._lib import LstmError

__all__ = ["LSTM", "LstmError", "param_names"]

_DTYPES = {torch.float64: _lib.F64, torch.float32: _lib.F32, torch.bfloat16: _lib.BF16, torch.float16: _lib.F16}


def param_names(num_layers, bidirectional, bias, proj_size):
    """nn.LSTM's parameter names in nn.LSTM's order (the C API's order too)."""
    names = []
    for layer in range(num_layers):
        for d in range(2 if bidirectional else 1):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            names += [f"weight_ih{sfx}", f"weight_hh{sfx}"]
            if bias:
                names += [f"bias_ih{sfx}", f"bias_hh{sfx}"]
            if proj_size > 0:
                names += [f"weight_hr{sfx}"]
    return names


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


def _ptr_array(ts):
    arr = (ctypes.c_void_p * len(ts))()
    for i, t in enumerate(ts):
        arr[i] = t.data_ptr()
    return arr


# ---- PyTorch's caching allocator for the engine's GPU memory under torch.cuda.graph capture ----
# Memory a captured call uses must stay the graph's until the graph is gone: PyTorch's allocator
# keeps blocks allocated during capture in the graph's private pool; the engine's own arena does
# not know about graphs. So while the current stream is capturing, the engine allocates through
# PyTorch (the C API's lstm_allocator).
def _torch_alloc(ctx, nbytes, stream):
    try:
        s = stream or 0
        if s == 1:  # cudaStreamLegacy
            s = 0
        return torch.cuda.caching_allocator_alloc(int(nbytes), stream=int(s))
    except Exception:  # noqa: BLE001 (the engine reports the failed allocation)
        return None


def _torch_free(ctx, p):
    try:
        torch.cuda.caching_allocator_delete(p)
    except Exception:  # noqa: BLE001 (nothing to report to from a free)
        pass


_ALLOC_CB = _lib.ALLOC_FN(_torch_alloc)
_FREE_CB = _lib.FREE_FN(_torch_free)
_TORCH_ALLOCATOR = _lib.Allocator(_ALLOC_CB, _FREE_CB, None)


def _allocator_for(device):
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return ctypes.pointer(_TORCH_ALLOCATOR)
    return None


def _stream_for(device):
    if device.type != "cuda":
        return None
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream or None)


# Backend handles released while the current CUDA stream is being captured (torch.cuda.graph):
# destroying a backend frees device memory, streams and graphs, calls that would invalidate the
# capture (a module dropped inside the capture block, e.g. by rebinding a variable that held the
# last output of another module). They are destroyed at the next call made outside a capture.
_deferred = []
_deferred_lock = threading.Lock()


def _capturing():
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 (no usable CUDA: nothing is being captured)
        return False


def _destroy_deferred():
    if not _deferred or _capturing():
        return
    with _deferred_lock:
        todo, _deferred[:] = list(_deferred), []
    for p, destroy in todo:
        destroy(p)


class _Handle:
    """Owns a C handle; destroyed with its Python object (a backend's destruction waits for the
    end of a CUDA graph capture that is under way: _deferred)."""

    __slots__ = ("ptr", "_destroy", "_defer", "__weakref__")

    def __init__(self, ptr, destroy, defer_in_capture=False):
        self.ptr = ptr
        self._destroy = destroy
        self._defer = defer_in_capture

    def close(self):
        if self.ptr:
            p, self.ptr = self.ptr, None
            if self._defer and _capturing():
                with _deferred_lock:
                    _deferred.append((p, self._destroy))
            else:
                self._destroy(p)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


class _Backend:
    """One engine backend instance (spec, dtype, device, options)."""

    def __init__(self, spec, dtype, device, algo, cudnn_algo, cuda_graphs, allow_tf32):
        _destroy_deferred()
        lib = _lib.lib()
        opts = _lib.BackendOptions(algo.encode(), cudnn_algo.encode() if cudnn_algo else None,
                                   cuda_graphs.encode() if cuda_graphs else None, None, int(bool(allow_tf32)))
        out = ctypes.c_void_p()
        dev = _lib.CUDA if device.type == "cuda" else _lib.CPU
        index = device.index if device.index is not None else (torch.cuda.current_device() if dev == _lib.CUDA else 0)
        _lib.check(lib.lstm_backend_create(ctypes.byref(spec), _DTYPES[dtype], dev, index, ctypes.byref(opts),
                                           ctypes.byref(out)))
        self.handle = _Handle(out.value, lib.lstm_backend_destroy, defer_in_capture=True)
        self.spec = spec
        self.device = device
        # Backends are not thread-safe: a module used from several threads (autograd's device
        # thread runs backward) takes turns.
        self.lock = threading.Lock()

    def info(self, key):
        return _lib.text(_lib.lib().lstm_backend_info(self.handle.ptr, key.encode()))

    def flat_layout(self, count):
        """(bytes, byte offsets) of the backend's flat weight layout (cuDNN's weight space), or None."""
        if not hasattr(self, "_layout"):
            nbytes = ctypes.c_size_t()
            offsets = (ctypes.c_size_t * count)()
            _lib.check(_lib.lib().lstm_backend_flat_layout(self.handle.ptr, ctypes.byref(nbytes), offsets, count))
            self._layout = (nbytes.value, list(offsets)) if nbytes.value else None
        return self._layout

    def forward(self, x, lengths, h0, c0, weights, training, seed, want_saved):
        _destroy_deferred()
        lib = _lib.lib()
        s = self.spec
        if s.batch_first:
            B, T = x.shape[0], x.shape[1]
        else:
            T, B = x.shape[0], x.shape[1]
        D = 2 if s.bidirectional else 1
        hout = s.proj_size if s.proj_size > 0 else s.hidden_size
        LD = s.num_layers * D
        out_shape = (B, T, D * hout) if s.batch_first else (T, B, D * hout)
        output = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        h_n = torch.empty((LD, B, hout), dtype=x.dtype, device=x.device)
        c_n = torch.empty((LD, B, s.hidden_size), dtype=x.dtype, device=x.device)
        w = _ptr_array(weights)
        lens = None
        if lengths is not None:
            lens = (ctypes.c_int64 * B)(*lengths)
        args = _lib.ForwardArgs(T, B, x.data_ptr(), lens, _ptr(h0), _ptr(c0), w, len(weights), int(training),
                                seed, output.data_ptr(), h_n.data_ptr(), c_n.data_ptr(), _stream_for(x.device),
                                _allocator_for(x.device))
        saved = ctypes.c_void_p() if want_saved else None
        with self.lock:
            _lib.check(lib.lstm_backend_forward(self.handle.ptr, ctypes.byref(args),
                                                ctypes.byref(saved) if want_saved else None))
        sv = _Handle(saved.value, lib.lstm_saved_destroy) if want_saved else None
        return output, h_n, c_n, sv

    def backward(self, saved, weights, d_output, d_h_n, d_c_n, d_x, d_h0, d_c0, d_weights, device):
        lib = _lib.lib()
        args = _lib.BackwardArgs(_ptr_array(weights), len(weights), _ptr(d_output), _ptr(d_h_n), _ptr(d_c_n),
                                 _ptr(d_x), _ptr(d_h0), _ptr(d_c0), _ptr_array(d_weights), _stream_for(device),
                                 _allocator_for(device))
        with self.lock:
            _lib.check(lib.lstm_backend_backward(self.handle.ptr, saved.ptr, ctypes.byref(args)))
        saved.close()


def _views(flat, offsets, like):
    es = flat.element_size()
    return [flat[o // es:o // es + t.numel()].view(t.shape) for o, t in zip(offsets, like)]


def _flat_layout_of(backend, weights):
    """The backend's flat layout when `weights` sit in it (views of one buffer at its offsets)."""
    if weights[0].device.type != "cuda":
        return None
    layout = backend.flat_layout(len(weights))
    if layout is None:
        return None
    base = weights[0].data_ptr() - layout[1][0]
    if all(w.data_ptr() == base + o for w, o in zip(weights, layout[1])):
        return layout
    return None


class _LstmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend, lengths, training, seed, x, h0, c0, *weights):
        output, h_n, c_n, saved = backend.forward(x, lengths, h0, c0, weights, training, seed, True)
        ctx.backend = backend
        ctx.saved = saved
        ctx.call = (lengths, training, seed)
        ctx.flat = _flat_layout_of(backend, weights)
        ctx.save_for_backward(x, h0, c0, *weights)
        return output, h_n, c_n

    @staticmethod
    @once_differentiable  # the engine's backward is not itself differentiable: a clear error
    def backward(ctx, d_output, d_h_n, d_c_n):
        x, h0, c0, *weights = ctx.saved_tensors
        if ctx.saved is None or not ctx.saved.ptr:
            # A second backward through the same graph (retain_graph=True): the engine's saved
            # state serves one backward, so the forward runs again (same inputs, weights and
            # dropout seed: the same activations) to make a new one.
            lengths, training, seed = ctx.call
            ctx.saved = ctx.backend.forward(x, lengths, h0, c0, weights, training, seed, True)[3]
        need = ctx.needs_input_grad  # (backend, lengths, training, seed, x, h0, c0, *weights)
        d_x = torch.empty_like(x) if need[4] else None
        d_h0 = torch.empty_like(h0) if h0 is not None and need[5] else None
        d_c0 = torch.empty_like(c0) if c0 is not None and need[6] else None
        # The engine adds into d_weights: zeros give the gradients alone; autograd accumulates .grad.
        # Weights laid out in the backend's flat layout get their gradients in the same layout, so
        # that the backend accumulates them in place.
        layout = ctx.flat
        if layout is not None:
            flat = torch.zeros(layout[0] // weights[0].element_size(), dtype=weights[0].dtype,
                               device=weights[0].device)
            d_w = _views(flat, layout[1], weights)
        else:
            d_w = [torch.zeros_like(w) for w in weights]
        cont = [g.contiguous() if g is not None else None for g in (d_output, d_h_n, d_c_n)]
        ctx.backend.backward(ctx.saved, weights, cont[0], cont[1], cont[2], d_x, d_h0, d_c0, d_w, x.device)
        ctx.saved = None
        wg = [g if n else None for g, n in zip(d_w, need[7:])]
        return (None, None, None, None, d_x, d_h0, d_c0, *wg)


class LSTM(nn.Module):
    """torch.nn.LSTM's constructor and forward, computed by lstm-engine.

    Extra keyword arguments (all optional):
      algo: the engine's backend: "auto" (the default: the fastest that runs the case, by
        measurement), "reference", "onednn" (CPU), "cudnn", "cudnn:standard", ..., "fused" (GPU);
        lstm_engine.backends() lists this build's.
      cudnn_algo: for algo "cudnn": "heuristic" (PyTorch's rule, the default), "standard", ..., "auto".
      cuda_graphs: "auto" (default), "on", "off": whether GPU backends replay their calls as CUDA
        graphs of their own (inside torch.cuda.graph they always run eagerly into PyTorch's graph).
      flat_weights: True (default): on a GPU backend with a flat weight layout (cuDNN's weight
        space) the parameters are moved into one buffer in that layout on the first forward and
        stay views of it (nn.LSTM's flatten_parameters), so that the engine reads them and
        accumulates their gradients in place instead of copying them on every call.
    """

    __constants__ = ["mode", "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                     "bidirectional", "proj_size"]

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None, *, algo="auto", cudnn_algo=None,
                 cuda_graphs=None, flat_weights=True):
        super().__init__()
        # nn.LSTM's own checks, with its messages.
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError("hidden_size must be an integer greater than zero")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError("num_layers must be an integer greater than zero")
        if not isinstance(input_size, int) or input_size <= 0:
            raise ValueError("input_size must be an integer greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}")
        self.mode = "LSTM"
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        self.algo = algo
        self.cudnn_algo = cudnn_algo
        self.cuda_graphs = cuda_graphs
        self.flat_weights = flat_weights
        factory = {"device": device, "dtype": dtype}
        D = 2 if bidirectional else 1
        hout = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names = param_names(num_layers, bidirectional, bias, proj_size)
        for name in self._flat_weights_names:
            layer = int(name.split("_l")[1].split("_")[0])
            in_size = input_size if layer == 0 else D * hout
            kind = name.split("_l")[0]
            shape = {"weight_ih": (4 * hidden_size, in_size), "weight_hh": (4 * hidden_size, hout),
                     "bias_ih": (4 * hidden_size,), "bias_hh": (4 * hidden_size,),
                     "weight_hr": (proj_size, hidden_size)}[kind]
            self.register_parameter(name, nn.Parameter(torch.empty(shape, **factory)))
        self._backends = {}
        self.reset_parameters()

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        per = len(self._flat_weights_names) // (self.num_layers * (2 if self.bidirectional else 1))
        w = self._flat_weights
        return [w[i:i + per] for i in range(0, len(w), per)]

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            nn.init.uniform_(w, -stdv, stdv)

    def flatten_parameters(self):
        """nn.LSTM's: kept for drop-in use. The parameters are flattened (when flat_weights and the
        backend has a flat layout) on the next forward on a GPU."""

    def _flatten(self, be, params):
        """Makes the parameters views into one buffer in the backend's flat layout (once; again after
        .to() or anything else that replaced them). Never while PyTorch's stream is capturing."""
        if _flat_layout_of(be, params) is not None or torch.cuda.is_current_stream_capturing():
            return
        layout = be.flat_layout(len(params))
        if layout is None:
            return
        flat = torch.zeros(layout[0] // params[0].element_size(), dtype=params[0].dtype, device=params[0].device)
        views = _views(flat, layout[1], params)
        with torch.no_grad():
            for p, v in zip(params, views):
                v.copy_(p)
                p.data = v

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        s += f", algo={self.algo!r}"
        return s

    def __getstate__(self):
        # Engine handles stay with their process: a copy (deepcopy, pickle, torch.save) makes its own.
        state = self.__dict__.copy()
        state["_backends"] = {}
        state.pop("_last_backend", None)
        return state

    def _spec(self):
        return _lib.Spec(self.input_size, self.hidden_size, self.num_layers, self.proj_size, int(self.bidirectional),
                         int(self.bias), int(self.batch_first), float(self.dropout))

    def _backend(self, dtype, device):
        tf32 = dtype == torch.float32 and device.type == "cuda" and torch.backends.cudnn.allow_tf32
        key = (device.type, device.index, dtype, tf32)
        be = self._backends.get(key)
        if be is None:
            be = _Backend(self._spec(), dtype, device, self.algo, self.cudnn_algo, self.cuda_graphs, tf32)
            self._backends[key] = be
        return be

    def backend_info(self, key="name"):
        """What the engine says about the backend of the last call: "name", "last_run" or "log"."""
        be = getattr(self, "_last_backend", None)
        return be.info(key) if be is not None else None

    def forward(self, input, hx=None):  # noqa: A002 (nn.LSTM's argument name)
        packed = isinstance(input, PackedSequence)
        lengths = None
        unbatched = False
        if packed:
            sorted_indices, unsorted_indices, batch_sizes = (input.sorted_indices, input.unsorted_indices,
                                                             input.batch_sizes)
            # The engine runs the batch in the packed (sorted) order, as nn.LSTM does: padding and
            # re-packing then need only batch_sizes, which live on the host (no device wait), and
            # h0/c0 and h_n/c_n are permuted on the device.
            x, lens = pad_packed_sequence(PackedSequence(input.data, batch_sizes), batch_first=self.batch_first)
            lengths = lens.tolist()
        else:
            x = input
            if x.dim() not in (2, 3):
                raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {x.dim()}D instead")
            if x.dim() == 2:
                unbatched = True
                x = x.unsqueeze(0 if self.batch_first else 1)
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {x.shape[-1]}")
        w = self._flat_weights
        dtype = w[0].dtype
        autocast = None
        if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
            # nn.LSTM runs in autocast's lower precision (cuDNN's RNN is on its fp16 list): so do
            # we, with the inputs, states and weights cast for the call (differentiably).
            autocast = torch.get_autocast_dtype("cuda")
            if dtype in (torch.float32, autocast) and x.dtype in (torch.float32, autocast):
                x = x.to(autocast)
                w = [t.to(autocast) for t in w]
                if hx is not None:
                    hx = tuple(t.to(autocast) for t in hx)
                dtype = autocast
        if x.dtype != dtype:
            raise ValueError(f"input must have the type {dtype}, got type {x.dtype}")
        if x.device != w[0].device:
            raise RuntimeError(f"Input and parameter tensors are not at the same device, found input tensor at "
                               f"{x.device} and parameter tensor at {w[0].device}")
        if dtype not in _DTYPES:
            raise LstmError(f"lstm_engine.torch.LSTM: dtype {dtype} is not supported (float64, float32, bfloat16, "
                            f"float16)")
        B = x.shape[0] if self.batch_first else x.shape[1]
        D = 2 if self.bidirectional else 1
        hout = self.proj_size if self.proj_size > 0 else self.hidden_size
        h0 = c0 = None
        if hx is not None:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise RuntimeError("LSTM: hx must be a tuple (h_0, c_0)")
            h0, c0 = hx
            if unbatched:
                if h0.dim() != 2 or c0.dim() != 2:
                    raise RuntimeError(f"For unbatched 2-D input, hx and cx should also be 2-D but got "
                                       f"({h0.dim()}-D, {c0.dim()}-D) tensors")
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
            want_h = (self.num_layers * D, B, hout)
            want_c = (self.num_layers * D, B, self.hidden_size)
            if tuple(h0.shape) != want_h:
                raise RuntimeError(f"Expected hidden[0] size {want_h}, got {tuple(h0.shape)}")
            if tuple(c0.shape) != want_c:
                raise RuntimeError(f"Expected hidden[1] size {want_c}, got {tuple(c0.shape)}")
            if h0.dtype != dtype or c0.dtype != dtype:
                raise ValueError(f"hx must have the type {dtype}, got {h0.dtype} and {c0.dtype}")
            if packed and sorted_indices is not None:
                h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)
            h0, c0 = h0.contiguous(), c0.contiguous()

        compute = dtype
        if x.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
            # The CPU backends compute in F32 (or F64): half types are widened for the call and the
            # results rounded back (autograd converts the gradients the same way).
            compute = torch.float32
            x = x.float()
            h0 = h0.float() if h0 is not None else None
            c0 = c0.float() if c0 is not None else None
            w = [t.float() for t in w]
        x = x.contiguous()
        w = [t.contiguous() for t in w]
        be = self._backend(compute, x.device)
        self._last_backend = be
        if self.flat_weights and compute == dtype and x.device.type == "cuda" and w[0].dtype == dtype and \
                self._flat_weights[0].dtype == dtype:
            self._flatten(be, self._flat_weights)
            w = self._flat_weights
        training = self.training and self.dropout > 0 and self.num_layers > 1
        seed = int(torch.randint(0, 2**62, (1,)).item()) if training else 0
        need_grad = torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in w) or
                                                 (h0 is not None and (h0.requires_grad or c0.requires_grad)))
        if need_grad:
            output, h_n, c_n = _LstmFunction.apply(be, lengths, training, seed, x, h0, c0, *w)
        else:
            output, h_n, c_n, _ = be.forward(x, lengths, h0, c0, w, training, seed, False)
        if compute != dtype:
            output, h_n, c_n = output.to(dtype), h_n.to(dtype), c_n.to(dtype)

        if packed:
            # The same batch_sizes and indices as the input, as nn.LSTM's result has; h_n/c_n in
            # the caller's order.
            p = pack_padded_sequence(output, lens, batch_first=self.batch_first, enforce_sorted=True)
            if unsorted_indices is not None:
                h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
            return PackedSequence(p.data, batch_sizes, sorted_indices, unsorted_indices), (h_n, c_n)
        if unbatched:
            output = output.squeeze(0 if self.batch_first else 1)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)


def from_torch(module, **kwargs):
    """An lstm_engine LSTM with a torch.nn.LSTM's configuration and a copy of its weights
    (on its device and dtype); kwargs: algo, cudnn_algo, cuda_graphs."""
    w = next(module.parameters())
    m = LSTM(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first,
             module.dropout, module.bidirectional, module.proj_size, device=w.device, dtype=w.dtype, **kwargs)
    m.load_state_dict(module.state_dict(), strict=True)
    return m

