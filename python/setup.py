"""Installs the `laissez` package: `pip install ./python` after a build (`make build`).

The compiled SDK (laissez/_native) and the gRPC stubs (laissez/v1) come from the build
folder's assembled package, `build/python/laissez` (or $LAISSEZ_BUILD_DIR/python/laissez),
so no network and no compiler run here:

    pip install --no-index --no-build-isolation ./python
"""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_package() -> str:
    build = os.environ.get("LAISSEZ_BUILD_DIR") or os.path.join(HERE, "..", "build")
    pkg = os.path.join(os.path.abspath(build), "python", "laissez")
    if not glob.glob(os.path.join(pkg, "_native*.so")) or not os.path.exists(os.path.join(pkg, "v1", "market_pb2.py")):
        raise SystemExit(f"laissez: no built SDK in {pkg}; run `make build` first (or set LAISSEZ_BUILD_DIR)")
    return pkg


class BuildWithNative(build_py):
    """Copies the compiled extension and the generated stubs beside the sources."""

    def run(self) -> None:
        super().run()
        src = built_package()
        dst = os.path.join(self.build_lib, "laissez")
        os.makedirs(os.path.join(dst, "v1"), exist_ok=True)
        for f in glob.glob(os.path.join(src, "_native*.so")):
            shutil.copy2(f, dst)
        for f in glob.glob(os.path.join(src, "v1", "*.py")):
            shutil.copy2(f, os.path.join(dst, "v1"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # The wheel carries a compiled module.
        return True


setup(
    name="laissez",
    version="0.1.0",
    description="LaissezCloud tenant SDK: EconAdapter, strategies and gRPC client",
    packages=["laissez"],
    package_data={"laissez": ["py.typed", "*.pyi"]},
    python_requires=">=3.9",
    install_requires=[],  # grpcio and protobuf: Debian's python3-grpcio / python3-protobuf.
    cmdclass={"build_py": BuildWithNative},
    distclass=BinaryDistribution,
)
