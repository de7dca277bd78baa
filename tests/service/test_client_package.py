"""`turnstile-client` builds as a wheel that carries its generated stubs, from the repository alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_generates_and_carries_the_stubs(tmp_path):
    # A copy of the sources without generated stubs, laid out as in the repository.
    shutil.copytree(ROOT / "protos", tmp_path / "protos")
    shutil.copytree(ROOT / "clients" / "python", tmp_path / "clients" / "python",
                    ignore=shutil.ignore_patterns("generate_pb2*", "*.egg-info", "__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "-w", str(tmp_path / "dist"), str(tmp_path / "clients" / "python")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("turnstile_client-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"turnstile_client/pb/generate_pb2.py", "turnstile_client/pb/generate_pb2_grpc.py",
            "turnstile_client/client.py", "turnstile_client/cli.py"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "turnstile = turnstile_client.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
