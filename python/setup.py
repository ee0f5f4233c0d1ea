"""Bundles the engine's shared libraries into the package (lstm_engine/lib/) at build time.

The Python code is pure; the wheel carries liblstm_c.so and liblstm.so from a build of the
engine, found at (first wins): $LSTM_ENGINE_LIB (the library or its folder), then ../build-cpu,
../build (relative to this folder). Without one the package installs without a bundled library
and looks for it at run time (lstm_engine/_lib.py). $LSTM_ENGINE_NO_BUNDLE=1 skips bundling.
"""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_build():
    env = os.environ.get("LSTM_ENGINE_LIB")
    if env:
        d = env if os.path.isdir(env) else os.path.dirname(env)
        if not os.path.exists(os.path.join(d, "liblstm_c.so")):
            raise SystemExit(f"LSTM_ENGINE_LIB={env}: no liblstm_c.so there")
        return d
    for b in ("build-cpu", "build"):
        d = os.path.join(HERE, "..", b)
        if os.path.exists(os.path.join(d, "liblstm_c.so")):
            return os.path.realpath(d)
    return None


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        if os.environ.get("LSTM_ENGINE_NO_BUNDLE") == "1":
            return
        d = find_build()
        if d is None:
            print("lstm_engine: no built liblstm_c.so found (LSTM_ENGINE_LIB, ../build-cpu, ../build): "
                  "installing without a bundled library")
            return
        dst = os.path.join(self.build_lib, "lstm_engine", "lib")
        os.makedirs(dst, exist_ok=True)
        for f in ["liblstm_c.so"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "liblstm.so*"))):
            shutil.copy2(os.path.join(d, f), os.path.join(dst, f))
            print(f"lstm_engine: bundling {os.path.join(d, f)}")


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools: the wheel package's
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

cmdclass = {"build_py": BuildPyWithLib}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """Any Python 3 (no Python ABI in the libraries), but this platform (they are ELF files)."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(cmdclass=cmdclass)
