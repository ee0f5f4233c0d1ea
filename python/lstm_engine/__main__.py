"""python -m lstm_engine: which library is loaded, its version, CUDA, and the backend registry."""

import sys

from . import _lib


def main():
    try:
        path = _lib.path()
    except OSError as e:
        print(e)
        return 1
    print(f"lstm_engine: {path} (engine {_lib.version()})")
    lib = _lib.lib()
    print("cuda:", "available" if _lib.cuda_available() else _lib.text(lib.lstm_cuda_unavailable_reason()))
    for b in _lib.backends():
        print(f"  {b['name']:<26} {b['summary']}")
    return 0


sys.exit(main())
