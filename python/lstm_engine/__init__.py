"""lstm-engine from Python.

  lstm_engine.torch.LSTM   a drop-in replacement for torch.nn.LSTM (needs PyTorch)
  lstm_engine.Model        a model trained by `lstm train`: forward on arrays or tensors
  lstm_engine.evaluate     `lstm eval`'s metrics; lstm_engine.predict: `lstm predict`
  lstm_engine.read_metrics a run folder's metrics.jsonl

The engine itself is liblstm_c.so (the C API), loaded through ctypes (lstm_engine._lib says
where it is looked for). docs/guide/python.md has install, usage and limits.
"""

from ._lib import LstmError, backends, cuda_available, version
from .model import Model, evaluate, predict, read_metrics

__version__ = "0.1.0"
__all__ = ["LstmError", "Model", "backends", "cuda_available", "evaluate", "predict", "read_metrics", "version"]
