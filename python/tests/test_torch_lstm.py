"""lstm_engine.torch.LSTM against torch.nn.LSTM: golden files, random cases of every option,
PackedSequence, state_dict, errors, CUDA graphs and a training loop. GPU cases skip (with the
reason) where there is no GPU; scripts/gpu_check.sh runs them on the H200."""

import glob
import math
import os

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from conftest import FIXTURES, TOL, needs_cuda, read_safetensors, rel_l2
import lstm_engine
from lstm_engine import LstmError, _lib
from lstm_engine.torch import LSTM, from_torch, param_names

GOLDEN = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIXTURES, "lstm_*.safetensors")))
GPU_ALGOS = ["auto", "cudnn", "fused"]


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 cases compare at fp32's tolerance: TF32 off unless a test turns it on."""
    old = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def run(mod, x, lengths=None, h0=None, c0=None, r=None, batch_first=False):
    """Output (padded to x's T), h_n, c_n and the gradients of sum(out*r0)+sum(h_n*r1)+sum(c_n*r2)
    with respect to x, h0, c0 and every parameter (nn.LSTM's order)."""
    x = x.detach().clone().requires_grad_(True)
    T = x.shape[1] if batch_first else x.shape[0]
    hx = None
    if h0 is not None:
        h0 = h0.detach().clone().requires_grad_(True)
        c0 = c0.detach().clone().requires_grad_(True)
        hx = (h0, c0)
    if lengths is not None:
        packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
        out_p, (h_n, c_n) = mod(packed, hx)
        assert torch.equal(out_p.batch_sizes, packed.batch_sizes)
        assert torch.equal(out_p.sorted_indices, packed.sorted_indices)
        assert torch.equal(out_p.unsorted_indices, packed.unsorted_indices)
        out, _ = pad_packed_sequence(out_p, batch_first=batch_first, total_length=T)
    else:
        out, (h_n, c_n) = mod(x, hx)
    if r is None:
        g = torch.Generator().manual_seed(7)
        r = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (out, h_n, c_n)]
    loss = sum((t * ri.to(t.device, t.dtype)).sum() for t, ri in zip((out, h_n, c_n), r))
    wrt = [x] + ([h0, c0] if h0 is not None else []) + [p for _, p in mod.named_parameters()]
    grads = torch.autograd.grad(loss, wrt)
    names = ["input"] + (["h0", "c0"] if h0 is not None else []) + [n for n, _ in mod.named_parameters()]
    return out, h_n, c_n, dict(zip(names, grads)), r


def weight_grad_tol(tol):
    """A weight gradient sums over every step and sequence, in another order per backend: in fp32
    its rounding grows past DESIGN.md's 1e-5 on small gradients. cuDNN's fp32 weight gradients
    measured 2.0e-5 on the H200 (lstm_input_gt_hidden); the conformance suite allows 5e-5 there
    (tests/lstm_conformance_util.hpp, weight_grad_tol), and so does this."""
    return 5e-5 if tol == 1e-5 else tol


def compare(got, ref, tol, what):
    out, h_n, c_n, grads = got[:4]
    rout, rh, rc, rgrads = ref[:4]
    errs = {"output": rel_l2(out, rout), "h_n": rel_l2(h_n, rh), "c_n": rel_l2(c_n, rc)}
    for k, g in rgrads.items():
        errs["grad." + k] = rel_l2(grads[k], g)
    weights = {"grad." + k for k in rgrads if k.startswith(("weight_", "bias_"))}
    bad = {k: v for k, v in errs.items() if not v < (weight_grad_tol(tol) if k in weights else tol)}
    assert not bad, f"{what}: relative L2 errors above {tol}: {bad}"


def spec_of(meta):
    return dict(input_size=int(meta["input_size"]), hidden_size=int(meta["hidden_size"]),
                num_layers=int(meta["num_layers"]), bias=meta["bias"] == "1", batch_first=meta["batch_first"] == "1",
                bidirectional=meta["bidirectional"] == "1", proj_size=int(meta["proj_size"]))


def golden_case(name, dtype, device, algo="auto"):
    t, meta = read_safetensors(os.path.join(FIXTURES, name))
    spec = spec_of(meta)
    mod = LSTM(**spec, algo=algo, dtype=dtype, device=device)
    mod.load_state_dict({k: t[k] for k in param_names(spec["num_layers"], spec["bidirectional"], spec["bias"],
                                                        spec["proj_size"])}, strict=True)
    lengths = t.get("lengths")
    h0 = t["h0"].to(device, dtype) if "h0" in t else None
    c0 = t["c0"].to(device, dtype) if "c0" in t else None
    got = run(mod, t["input"].to(device, dtype), lengths, h0, c0, [t["r_output"], t["r_h_n"], t["r_c_n"]],
              spec["batch_first"])
    ref_grads = {"input": t["grad_input"]}
    if h0 is not None:
        ref_grads.update(h0=t["grad_h0"], c0=t["grad_c0"])
    for k in mod.state_dict():
        ref_grads[k] = t["grad." + k]
    # Past each length the gradient of the input is zero, in the file and here.
    return got, (t["output"], t["h_n"], t["c_n"], ref_grads), meta


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_cpu(name):
    t, meta = read_safetensors(os.path.join(FIXTURES, name))
    dtype = torch.float64 if meta["dtype"] == "F64" else torch.float32
    got, ref, _ = golden_case(name, dtype, "cpu")
    compare(got, ref, TOL[dtype], name)


@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("algo", ["reference", "onednn"])
def test_golden_cpu_f32_backends(name, algo):
    if algo == "onednn" and any(b["name"] == "onednn" and "not in this binary" in b["summary"]
                                for b in lstm_engine.backends()):
        pytest.skip("this build has no oneDNN")
    got, ref, _ = golden_case(name, torch.float32, "cpu", algo)
    compare(got, ref, TOL[torch.float32], f"{name} {algo} f32")


@needs_cuda
@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("algo", GPU_ALGOS)
@pytest.mark.parametrize("prec", ["f32", "tf32", "bf16", "f16"])
def test_golden_cuda(name, algo, prec):
    dtype = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[prec]
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    try:
        got, ref, _ = golden_case(name, dtype, "cuda", algo)
    except LstmError as e:  # a backend that refuses the case says why; the message is checked
        assert "cannot run this case" in str(e), str(e)
        pytest.skip(f"{algo}: {e}")
    compare(got, ref, TOL["tf32" if prec == "tf32" else dtype], f"{name} cuda {algo} {prec}")


@needs_cuda
@pytest.mark.parametrize("name", [n for n in GOLDEN if "f32" not in n])
def test_golden_cuda_f64(name):
    got, ref, _ = golden_case(name, torch.float64, "cuda", "cudnn")
    compare(got, ref, TOL[torch.float64], f"{name} cuda f64")


# ---- random cases of every option ----
CASES = [
    dict(),
    dict(num_layers=2),
    dict(bidirectional=True),
    dict(num_layers=3, bidirectional=True),
    dict(proj_size=3),
    dict(num_layers=2, bidirectional=True, proj_size=2),
    dict(bias=False),
    dict(bias=False, bidirectional=True, proj_size=4),
    dict(batch_first=True),
    dict(batch_first=True, num_layers=2, bidirectional=True),
]
RUNS = [("plain", False, False), ("h0", True, False), ("packed", False, True), ("packed+h0", True, True)]


def random_case(kw, with_h0, packed, seed, device, dtype, algo="auto", I=5, H=6, T=7, B=4):
    g = torch.Generator().manual_seed(seed)
    ref = nn.LSTM(I, H, **kw).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 / math.sqrt(H) - 1 / math.sqrt(H))
    mod = from_torch(ref, algo=algo).to(device, dtype)
    bf = kw.get("batch_first", False)
    x = torch.randn((B, T, I) if bf else (T, B, I), generator=g, dtype=torch.float64)
    D = 2 if kw.get("bidirectional") else 1
    L = kw.get("num_layers", 1)
    hout = kw.get("proj_size", 0) or H
    h0 = c0 = None
    if with_h0:
        h0 = torch.randn((L * D, B, hout), generator=g, dtype=torch.float64)
        c0 = torch.randn((L * D, B, H), generator=g, dtype=torch.float64)
    lengths = None
    if packed:
        lengths = torch.tensor([3, T, 1, 5][:B])  # unsorted, one of length T
    want = run(ref, x, lengths, h0, c0, None, bf)
    got = run(mod, x.to(device, dtype), lengths, h0.to(device, dtype) if h0 is not None else None,
              c0.to(device, dtype) if c0 is not None else None, want[4], bf)
    return got, want


@pytest.mark.parametrize("kw", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("how", RUNS, ids=lambda r: r[0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_random_cpu(kw, how, dtype):
    got, want = random_case(kw, how[1], how[2], 11, "cpu", dtype)
    compare(got, want, TOL[dtype], f"{kw} {how[0]} {dtype}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("how", RUNS, ids=lambda r: r[0])
def test_random_cpu_half(dtype, how):
    """On the CPU half types are computed in F32 and rounded: within the half types' tolerance."""
    got, want = random_case(dict(num_layers=2, bidirectional=True), how[1], how[2], 12, "cpu", dtype)
    assert got[0].dtype == dtype and got[1].dtype == dtype
    compare(got, want, TOL[dtype], f"cpu {dtype}")


GPU_RUNS = [RUNS[0], RUNS[3]]  # plain; packed (unsorted lengths) with h0/c0
GPU_PRECS = [(a, p) for a in GPU_ALGOS for p in ("f32", "tf32", "bf16", "f16")] + [("cudnn", "f64")]


@needs_cuda
@pytest.mark.parametrize("kw", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("how", GPU_RUNS, ids=lambda r: r[0])
@pytest.mark.parametrize("algo,prec", GPU_PRECS, ids=lambda v: str(v))
def test_random_cuda(kw, how, algo, prec):
    dtype = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
             "f64": torch.float64}[prec]
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    try:
        got, want = random_case(kw, how[1], how[2], 13, "cuda", dtype, algo)
    except LstmError as e:
        assert "cannot run this case" in str(e) or "algo 'auto'" in str(e), str(e)
        pytest.skip(f"{algo}: {e}")
    assert got[0].device.type == "cuda"
    compare(got, want, TOL["tf32" if prec == "tf32" else dtype], f"{kw} {how[0]} {algo} {prec}")


@needs_cuda
def test_cuda_no_host_sync():
    """The forward and backward on CUDA tensors make PyTorch do no synchronising call (a
    device-to-host copy, an .item()) — packed input included."""
    mod = LSTM(5, 6, num_layers=2, bidirectional=True).cuda()
    x = torch.randn(7, 4, 5, device="cuda", requires_grad=True)
    packed = pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    h0 = torch.zeros(4, 4, 6, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, (h, c) = mod(x)
        (out.sum() + h.sum()).backward()
        out, (h, c) = mod(packed, (h0, h0.detach()))
        (out.data.sum() + h.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(x.grad).all()


@needs_cuda
def test_cuda_current_stream():
    """Work goes on PyTorch's current stream: a side stream gives the same results."""
    torch.manual_seed(3)
    mod = LSTM(8, 16, num_layers=2, algo="cudnn").cuda()
    x = torch.randn(20, 3, 8, device="cuda")
    want, _ = mod(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got, _ = mod(x)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got, want)


# ---- dropout, unbatched input, no-grad ----
def test_dropout_eval_equals_torch_and_training_is_seeded():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 5, num_layers=3, dropout=0.5).double()
    mod = from_torch(ref)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    ref.eval()
    mod.eval()
    assert rel_l2(mod(x)[0], ref(x)[0]) < 1e-12
    mod.train()
    torch.manual_seed(5)
    a = mod(x)[0]
    torch.manual_seed(5)
    b = mod(x)[0]
    torch.manual_seed(6)
    c = mod(x)[0]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert rel_l2(a, ref(x)[0]) > 1e-3  # dropout changed something


def test_dropout_gradcheck():
    """Gradients in training mode with dropout, against finite differences (same seed each call)."""
    mod = LSTM(3, 4, num_layers=2, dropout=0.4, bidirectional=True, dtype=torch.float64)
    mod.train()
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)

    w = mod.weight_ih_l1.detach().clone().requires_grad_(True)

    def g(x, w):
        torch.manual_seed(1)
        out = torch.func.functional_call(mod, {"weight_ih_l1": w}, (x,))[0]
        return out

    assert torch.autograd.gradcheck(g, (x, w), eps=1e-6, atol=1e-6)


def test_unbatched_input():
    torch.manual_seed(1)
    ref = nn.LSTM(4, 5, num_layers=2, bidirectional=True).double()
    mod = from_torch(ref)
    x = torch.randn(6, 4, dtype=torch.float64)
    h0 = torch.randn(4, 5, dtype=torch.float64)
    c0 = torch.randn(4, 5, dtype=torch.float64)
    o1, (h1, c1) = ref(x, (h0, c0))
    o2, (h2, c2) = mod(x, (h0, c0))
    assert o2.shape == o1.shape and h2.shape == h1.shape
    assert rel_l2(o2, o1) < 1e-12 and rel_l2(h2, h1) < 1e-12 and rel_l2(c2, c1) < 1e-12


def test_no_grad_and_inference_mode():
    torch.manual_seed(2)
    ref = nn.LSTM(4, 5).double()
    mod = from_torch(ref)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        a = mod(x)[0]
    with torch.inference_mode():
        b = mod(x)[0]
    assert not a.requires_grad
    assert rel_l2(a, ref(x)[0]) < 1e-12 and torch.equal(a, b)


# ---- state_dict, names, errors ----
@pytest.mark.parametrize("kw", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
def test_state_dict_both_ways(kw):
    ref = nn.LSTM(5, 6, **kw)
    mod = LSTM(5, 6, **kw)
    assert list(mod.state_dict().keys()) == list(ref.state_dict().keys())
    for (n1, p1), (n2, p2) in zip(mod.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and p1.shape == p2.shape
    mod.load_state_dict(ref.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(mod.state_dict()[k], v)
    ref2 = nn.LSTM(5, 6, **kw)
    ref2.load_state_dict(mod.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(ref2.state_dict()[k], v)
    # The C API's order is nn.LSTM's.
    import ctypes
    spec = _lib.Spec(5, 6, kw.get("num_layers", 1), kw.get("proj_size", 0), int(kw.get("bidirectional", False)),
                     int(kw.get("bias", True)), int(kw.get("batch_first", False)), 0.0)
    names = ctypes.c_char_p()
    count = ctypes.c_int64()
    _lib.check(_lib.lib().lstm_spec_param_names(ctypes.byref(spec), ctypes.byref(names), ctypes.byref(count)))
    assert _lib.text(names.value).split("\n") == list(ref.state_dict().keys())


def test_reset_parameters_range():
    mod = LSTM(3, 16, num_layers=2)
    for p in mod.parameters():
        assert p.abs().max().item() <= 1 / math.sqrt(16)
        assert p.std().item() > 0.05  # not left at zero


def test_errors():
    with pytest.raises(LstmError, match="unknown LSTM backend 'nonsense'"):
        LSTM(3, 4, algo="nonsense")(torch.randn(2, 1, 3))
    # A GPU backend on CPU tensors: the registry's reason (a CPU build has no such row at all).
    with pytest.raises(LstmError, match="cudnn"):
        LSTM(3, 4, algo="cudnn")(torch.randn(2, 1, 3))
    onednn_built = not any(b["name"] == "onednn" and "not in this binary" in b["summary"]
                           for b in lstm_engine.backends())
    with pytest.raises(LstmError, match="onednn" if onednn_built else "built without oneDNN"):
        LSTM(3, 4, algo="onednn", dtype=torch.float64)(torch.randn(2, 1, 3, dtype=torch.float64))
    with pytest.raises(LstmError, match="cuda_graphs: expected auto, on or off, got 'sometimes'"):
        LSTM(3, 4, cuda_graphs="sometimes")(torch.randn(2, 1, 3))
    with pytest.raises(RuntimeError, match="input.size\\(-1\\) must be equal to input_size. Expected 3, got 5"):
        LSTM(3, 4)(torch.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size \\(1, 1, 4\\), got \\(2, 1, 4\\)"):
        LSTM(3, 4)(torch.randn(2, 1, 3), (torch.zeros(2, 1, 4), torch.zeros(1, 1, 4)))
    with pytest.raises(ValueError, match="input must have the type torch.float32"):
        LSTM(3, 4)(torch.randn(2, 1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):
        LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        LSTM(3, 4, dropout=1.5)


def test_backend_names_and_info():
    names = [b["name"] for b in lstm_engine.backends()]
    assert names[0] == "reference" and "onednn" in names
    # GPU rows are listed exactly in a CUDA build (whether or not this machine has a GPU).
    cpu_build = "this build has no CUDA" in (_lib.text(_lib.lib().lstm_cuda_unavailable_reason()) or "")
    assert ("cudnn" in names and "fused" in names) != cpu_build
    mod = LSTM(3, 4, algo="reference")
    mod(torch.randn(2, 1, 3))
    assert mod.backend_info("name") == "reference"


# ---- a small model trained in PyTorch: the same losses as with nn.LSTM ----
class Net(nn.Module):
    def __init__(self, lstm_cls, **kw):
        super().__init__()
        self.lstm = lstm_cls(6, 12, num_layers=2, bidirectional=True, batch_first=True, **kw)
        self.fc = nn.Linear(24, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(out[:, -1])


def train_losses(net, steps, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(steps, 8, 10, 6, generator=g).to(device, dtype)
    ys = (xs[..., 0].sum(-1) > 0).long() + (xs[..., 1].sum(-1) > 1).long()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xs[i]), ys[i])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-9), (torch.float32, 1e-4)], ids=["f64", "f32"])
def test_training_loop_matches_nn_lstm(dtype, tol):
    torch.manual_seed(4)
    ref = Net(nn.LSTM).to(dtype=dtype)
    ours = Net(LSTM).to(dtype=dtype)
    ours.load_state_dict(ref.state_dict(), strict=True)
    a = train_losses(ref, 40, "cpu", dtype)
    b = train_losses(ours, 40, "cpu", dtype)
    assert a[-1] < 0.8 * a[0]  # it learns
    for i, (u, v) in enumerate(zip(a, b)):
        assert abs(u - v) <= tol * max(1.0, abs(u)), f"step {i}: nn.LSTM {u}, ours {v}"
    for k, v in ref.state_dict().items():
        assert rel_l2(ours.state_dict()[k], v) < 100 * tol, k


@needs_cuda
@pytest.mark.parametrize("algo", GPU_ALGOS)
def test_training_loop_cuda(algo):
    torch.manual_seed(4)
    ref = Net(nn.LSTM).cuda()
    ours = Net(LSTM, algo=algo).cuda()
    ours.load_state_dict(ref.state_dict(), strict=True)
    a = train_losses(ref, 40, "cuda", torch.float32)
    b = train_losses(ours, 40, "cuda", torch.float32)
    assert a[-1] < 0.8 * a[0]
    for i, (u, v) in enumerate(zip(a, b)):
        assert abs(u - v) <= 1e-4 * max(1.0, abs(u)), f"step {i}: nn.LSTM {u}, ours ({algo}) {v}"


# ---- CUDA graph capture of a training step (torch.cuda.graphs) ----
@needs_cuda
@pytest.mark.parametrize("algo", GPU_ALGOS)
def test_cuda_graph_training_step(algo):
    torch.manual_seed(5)
    dev = "cuda"
    ours = Net(LSTM, algo=algo).to(dev)
    ref = Net(nn.LSTM).to(dev)
    ref.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(9)
    data = [(torch.randn(8, 10, 6, generator=g).to(dev), torch.randint(0, 3, (8,), generator=g).to(dev))
            for _ in range(8)]
    sx, sy = data[0][0].clone(), data[0][1].clone()

    def step(net, o, x, y):
        o.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        o.step()
        return loss

    # Warm-up on a side stream (torch.cuda.graphs' rule), mirrored eagerly on nn.LSTM.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            sx.copy_(data[i][0])
            sy.copy_(data[i][1])
            step(ours, opt, sx, sy)
    torch.cuda.current_stream().wait_stream(s)
    for i in range(3):
        step(ref, ropt, *data[i])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(ours, opt, sx, sy)
    for i in range(3, 8):
        sx.copy_(data[i][0])
        sy.copy_(data[i][1])
        graph.replay()
        want = step(ref, ropt, *data[i]).item()
        got = static_loss.item()
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), f"replay {i}: graphed ours {got}, nn.LSTM {want}"
    for k, v in ref.state_dict().items():
        assert rel_l2(ours.state_dict()[k], v) < 1e-3, k


@needs_cuda
def test_module_dropped_inside_a_capture_does_not_break_it():
    """A module whose last reference goes inside a torch.cuda.graph capture block (here the output
    of an earlier training step, whose autograd node holds the module's engine) is destroyed after
    the capture: destroying it during the capture (device frees, stream and graph destruction)
    would invalidate the capture."""
    import lstm_engine.torch as lt
    dev = "cuda"
    torch.manual_seed(11)
    old = LSTM(6, 8, algo="fused", device=dev)
    out_old, _ = old(torch.randn(5, 2, 6, device=dev))
    out_old.sum().backward()
    del old  # out_old's autograd node now holds the engine's last reference
    ref = nn.LSTM(6, 8).to(dev)
    mod = LSTM(6, 8, algo="fused", device=dev)
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(5, 2, 6, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y, _ = mod(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_old = None  # the old module goes here
        y, _ = mod(x)
    assert len(lt._deferred) == 1
    x.copy_(torch.randn(5, 2, 6, device=dev))
    g.replay()
    torch.cuda.synchronize()
    assert rel_l2(y, ref(x)[0]) < 1e-5
    mod(x)  # the next call outside a capture destroys the deferred engine
    assert len(lt._deferred) == 0


def test_retain_graph_and_double_backward():
    torch.manual_seed(8)
    ref = nn.LSTM(3, 4, num_layers=2).double()
    mod = from_torch(ref)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    out, _ = mod(x)
    (g1,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
    (g2,) = torch.autograd.grad((2 * out).sum(), x)  # a second backward through the same forward
    assert rel_l2(g2, 2 * g1) < 1e-12
    (gr,) = torch.autograd.grad(ref(x)[0].sum(), x)
    assert rel_l2(g1, gr) < 1e-12
    out, _ = mod(x)
    (g,) = torch.autograd.grad((out**2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        g.sum().backward()


@needs_cuda
@pytest.mark.parametrize("algo", ["cudnn", "auto"])
def test_cuda_flat_weights_in_place(algo):
    """On cuDNN the parameters become views of one buffer in its weight layout (nn.LSTM's
    flatten_parameters) and give the same results and gradients as separate tensors."""
    torch.manual_seed(9)
    ref = nn.LSTM(5, 8, num_layers=2, bidirectional=True, proj_size=3)
    flat = from_torch(ref, algo=algo).cuda()
    sep = LSTM(5, 8, num_layers=2, bidirectional=True, proj_size=3, algo=algo, flat_weights=False).cuda()
    sep.load_state_dict(flat.state_dict())
    x = torch.randn(6, 3, 5, device="cuda")
    got = run(flat, x)
    want = run(sep, x, r=got[4])
    ptrs = {p.untyped_storage().data_ptr() for p in flat.parameters()}
    layout = flat._last_backend.flat_layout(len(flat._flat_weights))
    if layout is None:
        pytest.skip(f"{algo}: the backend has no flat weight layout")
    assert len(ptrs) == 1, "the parameters are not views of one buffer"
    assert len({p.untyped_storage().data_ptr() for p in sep.parameters()}) > 1
    compare(got, want[:4], 1e-6, f"flat vs separate weights ({algo})")
    # The state_dict still has nn.LSTM's tensors and loads back into nn.LSTM.
    ref2 = nn.LSTM(5, 8, num_layers=2, bidirectional=True, proj_size=3)
    ref2.load_state_dict({k: v.cpu() for k, v in flat.state_dict().items()}, strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(ref2.state_dict()[k], v)


@needs_cuda
def test_cuda_autocast():
    """Under torch.autocast the LSTM runs in the autocast dtype, as nn.LSTM does."""
    torch.manual_seed(10)
    ref = nn.LSTM(6, 12, num_layers=2).double()
    ours = from_torch(ref).float().cuda()
    x = torch.randn(9, 4, 6, dtype=torch.float64)
    with torch.autocast("cuda", dtype=torch.float16):
        out, (h, c) = ours(x.float().cuda())
    assert out.dtype == torch.float16 and h.dtype == torch.float16
    want, (wh, wc) = ref(x)
    assert rel_l2(out, want) < TOL[torch.float16] and rel_l2(h, wh) < TOL[torch.float16]
    assert ours.weight_ih_l0.dtype == torch.float32


def test_packed_sorted_without_indices():
    """A PackedSequence made with enforce_sorted=True (no indices) comes back the same way."""
    torch.manual_seed(11)
    ref = nn.LSTM(3, 5, num_layers=2, bidirectional=True).double()
    mod = from_torch(ref)
    x = torch.randn(6, 3, 3, dtype=torch.float64)
    h0 = torch.randn(4, 3, 5, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([6, 4, 2]), enforce_sorted=True)
    assert packed.sorted_indices is None
    o1, (h1, c1) = ref(packed, (h0, h0))
    o2, (h2, c2) = mod(packed, (h0, h0))
    assert o2.sorted_indices is None and torch.equal(o2.batch_sizes, o1.batch_sizes)
    assert rel_l2(o2.data, o1.data) < 1e-12 and rel_l2(h2, h1) < 1e-12 and rel_l2(c2, c1) < 1e-12


def test_deepcopy_and_save_load(tmp_path):
    import copy

    torch.manual_seed(12)
    mod = LSTM(3, 4, num_layers=2, algo="reference")
    x = torch.randn(5, 2, 3)
    want = mod(x)[0]
    twin = copy.deepcopy(mod)
    torch.save(mod, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    assert torch.equal(twin(x)[0], want) and torch.equal(loaded(x)[0], want)
    assert twin._backends is not mod._backends and loaded.algo == "reference"
