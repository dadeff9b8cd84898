"""Builds kvx._kvx from python/_kvx.c and the library's own sources (../src), so that
`pip install ./python` needs no prior CMake build. The wire schema is compiled with protoc-c
as the CMake build does; compile and link flags come from pkg-config, and UCX's from
KVX_UCX_ROOT when that names a UCX prefix (as CMake's -DKVX_UCX_ROOT). KVX_CUDA=ON (or the
CUDA toolkit's prefix) builds GPU memory in, as CMake's -DKVX_CUDA=ON: cuda.h from the
toolkit, the driver loaded at run time (docs/gpu.md)."""
import os
import pathlib
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
UCX_ROOT = os.environ.get("KVX_UCX_ROOT")
CUDA = os.environ.get("KVX_CUDA", "")
CUDA_ROOT = CUDA if CUDA.startswith("/") else "/usr/local/cuda"
PACKAGES = ["libcjson", "libprotobuf-c", "libcrypto", "libxxhash", "libzmq"] + (
    [] if UCX_ROOT else ["ucx"])


def pkg_config(flag):
    out = subprocess.run(["pkg-config", flag, *PACKAGES], check=True, capture_output=True,
                         text=True).stdout
    return shlex.split(out)


def ucx_flags(flag):
    """A UCX prefix's flags, its lib/ in the extension's RPATH; nothing for pkg-config's."""
    if not UCX_ROOT:
        return []
    if flag == "--cflags":
        return ["-I%s/include" % UCX_ROOT]
    return ["-L%s/lib" % UCX_ROOT, "-Wl,-rpath,%s/lib" % UCX_ROOT, "-lucp", "-luct", "-lucs"]


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


def cuda_flags(flag):
    if CUDA.upper() not in ("ON", "1") and not CUDA.startswith("/"):
        return []
    if flag == "--cflags":
        return ["-DKVX_HAVE_CUDA", "-I%s/include" % CUDA_ROOT]
    return ["-ldl"]


# setuptools takes sources relative to this directory only
sources = ["_kvx.c"] + sorted(os.path.relpath(p, HERE) for p in (ROOT / "src").glob("*.c"))
setup(
    ext_modules=[Extension(
        "kvx._kvx", sources,
        include_dirs=[str(ROOT / "include"), str(ROOT / "src")],
        extra_compile_args=["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-fvisibility=hidden",
                            *ucx_flags("--cflags"), *cuda_flags("--cflags"),
                            *pkg_config("--cflags")],
        extra_link_args=ucx_flags("--libs") + pkg_config("--libs") + cuda_flags("--libs") +
        ["-lm"])],
    cmdclass={"build_ext": BuildWithProto},
)
