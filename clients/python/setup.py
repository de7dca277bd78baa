"""Generates the gRPC stubs (turnstile_client/pb/generate_pb2*.py) before building when missing.

Everything else is in pyproject.toml. The .proto lives at ../../protos in the Turnstile repository,
so building from a copy of this folder alone needs the stubs generated beforehand.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE.parent.parent / "protos" / "turnstile" / "v1"
STUBS = [HERE / "turnstile_client" / "pb" / name
         for name in ("generate_pb2.py", "generate_pb2_grpc.py", "generate_pb2.pyi")]


def generate_stubs() -> None:
    if all(stub.exists() for stub in STUBS):
        return
    if not (PROTO_DIR / "generate.proto").exists():
        raise SystemExit(f"turnstile-client: the gRPC stubs are missing and {PROTO_DIR / 'generate.proto'} "
                         "is not there to generate them from; build from a Turnstile checkout "
                         "(clients/python) or generate the stubs first")
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    out = str(HERE)
    if protoc.main(["protoc", f"-Iturnstile_client/pb={PROTO_DIR}", f"--python_out={out}",
                    f"--grpc_python_out={out}", f"--pyi_out={out}", "turnstile_client/pb/generate.proto"]):
        raise SystemExit("turnstile-client: grpc_tools.protoc failed on generate.proto")


class BuildPy(build_py):
    def run(self):
        generate_stubs()
        super().run()


class Sdist(sdist):
    def run(self):
        generate_stubs()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
