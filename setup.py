"""Builds the optional C extensions declared in pyproject.toml, each compiler given only the flags it accepts."""

import os
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError


class PortableBuildExt(build_ext):
    """GCC and clang take -O3 and -fopenmp-simd; another compiler (MSVC, an older clang) builds without the flags it
    rejects, so that it builds the extension rather than fall back to Python for a flag's sake."""

    def build_extension(self, ext):
        ext.extra_compile_args = [flag for flag in ext.extra_compile_args if self._accepts(flag)]
        super().build_extension(ext)

    def _accepts(self, flag: str) -> bool:
        with tempfile.TemporaryDirectory() as folder:
            source = os.path.join(folder, "probe.c")
            with open(source, "w") as fh:
                fh.write("int main(void) { return 0; }\n")
            try:
                self.compiler.compile([source], output_dir=folder, extra_postargs=[flag, "-Werror"]
                                      if self.compiler.compiler_type == "unix" else [flag])
            except CompileError:
                return False
        return True


setup(cmdclass={"build_ext": PortableBuildExt})
