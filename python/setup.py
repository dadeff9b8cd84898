"""Builds kvx._kvx from python/_kvx.c and the library's own sources (../src), so that
`pip install ./python` needs no prior CMake build. The wire schema is compiled with protoc-c
as the CMake build does; compile and link flags come from pkg-config. KVX_UCX picks the UCX as
make's UCX does: wheel (the default) is UCX 1.22 from the checkout's .venv-ucx
(scripts/install-deps --ucx-wheel installs it there once), system is pkg-config's, anything
else a UCX prefix; a prefix's lib/ goes into the extension's RPATH. KVX_CUDA=ON (or the CUDA
toolkit's prefix) builds GPU memory in, as CMake's -DKVX_CUDA=ON: cuda.h from the toolkit, the
driver loaded at run time (docs/gpu.md)."""
import os
import pathlib
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CUDA = os.environ.get("KVX_CUDA", "")
CUDA_ROOT = CUDA if CUDA.startswith("/") else "/usr/local/cuda"
PACKAGES = ["libcjson", "libprotobuf-c", "libcrypto", "libxxhash", "libzmq"]


def ucx_root():
    """The UCX prefix KVX_UCX names, None for the system's. Asked only when the extension is
    built, so that reading the package's metadata installs nothing."""
    choice = os.environ.get("KVX_UCX") or "wheel"
    if choice == "system":
        return None
    if choice == "wheel":
        return subprocess.run([str(ROOT / "scripts" / "install-deps"), "--ucx-wheel"],
                              check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    return os.path.abspath(choice)


def pkg_config(flag, prefix):
    """Debian's -dev packages' flags, UCX's among them when no UCX prefix is given."""
    packages = PACKAGES + ([] if prefix else ["ucx"])
    out = subprocess.run(["pkg-config", flag, *packages], check=True, capture_output=True,
                         text=True).stdout
    return shlex.split(out)


def ucx_flags(flag, prefix):
    """A UCX prefix's flags, its lib/ in the extension's RPATH; nothing for pkg-config's."""
    if not prefix:
        return []
    if flag == "--cflags":
        return ["-I%s/include" % prefix]
    return ["-L%s/lib" % prefix, "-Wl,-rpath,%s/lib" % prefix, "-lucp", "-luct", "-lucs"]


class BuildWithProto(build_ext):
    """Generates kvx.pb-c.[ch] into the build directory first, and adds the flags of the
    chosen UCX. Always compiles anew: pip reuses python/build/ between installs, and an
    extension linked against another UCX would otherwise count as up to date."""

    def run(self):
        out = pathlib.Path(self.build_temp) / "proto"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["protoc-c", "--c_out=%s" % out, "-I%s" % (ROOT / "proto"),
                        str(ROOT / "proto" / "kvx.proto")], check=True)
        prefix = ucx_root()
        for ext in self.extensions:
            ext.sources.append(os.path.relpath(out / "kvx.pb-c.c", HERE))
            ext.include_dirs.append(str(out))
            ext.extra_compile_args += (ucx_flags("--cflags", prefix) +
                                       pkg_config("--cflags", prefix))
            ext.extra_link_args[:0] = ucx_flags("--libs", prefix) + pkg_config("--libs", prefix)
        self.force = True
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
                            *cuda_flags("--cflags")],
        extra_link_args=cuda_flags("--libs") + ["-lm"])],
    cmdclass={"build_ext": BuildWithProto},
)
