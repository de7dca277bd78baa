"""The shipped clients against a real server: the Python CLI, the Node client, and `buf curl`
(which finds the API through server reflection alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "clients" / "node" / "node_modules" / ".bin" / "buf"


def test_python_cli_streams_text(server, llm):
    want = llm.generate(["The capital of France is"], _greedy(6))[0]
    for module in (["-m", "turnstile_client"], ["-m", "clients.python", "generate"]):
        proc = subprocess.run(
            [sys.executable, *module, "The capital of France is", "--address", server.address,
             "--max-tokens", "6", "--temperature", "0", "--show-usage"],
            capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == want.text + "\n"
        assert "completion_tokens=6" in proc.stderr


def test_python_cli_reports_errors(server):
    proc = subprocess.run(
        [sys.executable, "-m", "turnstile_client", "Hi", "--address", server.address, "--top-p", "0"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: INVALID_ARGUMENT: sampling.top_p")


def test_node_client(server):
    env = {**os.environ, "TURNSTILE_ADDRESS": server.address}
    proc = subprocess.run(["npm", "test", "--prefix", str(ROOT / "clients" / "node")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# pass 5" in proc.stdout and "# fail 0" in proc.stdout


def test_buf_curl_through_reflection(server, llm):
    want = llm.generate(["Hello"], _greedy(4))[0]
    body = json.dumps({"text": "Hello", "max_tokens": 4, "sampling": {"temperature": 0}})
    proc = subprocess.run(
        [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--data", body,
         f"http://{server.address}/turnstile.v1.GenerationService/Generate"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    messages = [json.loads(m) for m in proc.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert "".join(m["text"] for m in messages) == want.text
    assert messages[-1]["finishReason"] == "FINISH_REASON_LENGTH"


def _greedy(max_tokens: int):
    from engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
