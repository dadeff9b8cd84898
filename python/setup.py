"""Builds kvx._kvx from python/_kvx.c and the library's own sources (../src), so that
`pip install ./python` needs no prior CMake build. The wire schema is compiled with protoc-c
as the CMake build does; compile and link flags come from pkg-config."""
import os
import pathlib
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = ["libcjson", "libprotobuf-c", "libcrypto", "ucx", "libzmq"]


def pkg_config(flag):
    out = subprocess.run(["pkg-config", flag, *PACKAGES], check=True, capture_output=True,
                         text=True).stdout
    return shlex.split(out)


class BuildWithProto(build_ext):
    """Generates kvx.pb-c.[ch] into the build directory first."""

    def run(self):
        out = pathlib.Path(self.build_temp) / "proto"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["protoc-c", "--c_out=%s" % out, "-I%s" % (ROOT / "proto"),
                        str(ROOT / "proto" / "kvx.proto")], check=True)
        for ext in self.extensions:
            ext.sources.append(os.path.relpath(out / "kvx.pb-c.c", HERE))
            ext.include_dirs.append(str(out))
        super().run()


# setuptools takes sources relative to this directory only
sources = ["_kvx.c"] + sorted(os.path.relpath(p, HERE) for p in (ROOT / "src").glob("*.c"))
setup(
    ext_modules=[Extension(
        "kvx._kvx", sources,
        include_dirs=[str(ROOT / "include"), str(ROOT / "src")],
        extra_compile_args=["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-fvisibility=hidden",
                            *pkg_config("--cflags")],
        extra_link_args=pkg_config("--libs") + ["-lm"])],
    cmdclass={"build_ext": BuildWithProto},
)
