"""`python -m service` flags and their TURNSTILE_* environment variables."""

import subprocess
import sys

import pytest

from service.config import parse_config


def test_defaults_serve_the_embedded_model_on_50051():
    config = parse_config([], environ={})
    assert (config.host, config.port, config.engine.model) == ("0.0.0.0", 50051, "default")
    assert config.engine.max_num_seqs == 64 and config.engine.enable_prefix_caching
    assert config.api_key is None and config.max_queue_size == 256


def test_environment_mirrors_flags_and_flags_win():
    env = {"TURNSTILE_MAX_NUM_SEQS": "8", "TURNSTILE_PORT": "6000", "TURNSTILE_API_KEY": "k",
           "TURNSTILE_ENABLE_PREFIX_CACHING": "false", "TURNSTILE_KV_CACHE_MEMORY": "512MiB"}
    config = parse_config(["--port", "7000"], environ=env)
    assert config.port == 7000  # the flag wins
    assert config.engine.max_num_seqs == 8 and config.api_key == "k"
    assert config.engine.enable_prefix_caching is False
    assert config.engine.kv_cache_memory_bytes == 512 << 20


@pytest.mark.parametrize("argv,env,message", [
    (["--max-num-seqs", "0"], {}, "max_num_seqs must be a positive integer"),
    (["--max-num-seqs", "64", "--max-num-batched-tokens", "32"], {}, "max_num_batched_tokens (32)"),
    (["--tls-cert", "cert.pem"], {}, "tls_cert and tls_key must be given together"),
    (["--kv-cache-memory", "lots"], {}, "expected a size like 1GiB"),
    ([], {"TURNSTILE_MAX_NUM_SEQS": "many"}, "TURNSTILE_MAX_NUM_SEQS='many'"),
    ([], {"TURNSTILE_SCHEDULING": "greedy"}, "choose from continuous, static"),
    ([], {"TURNSTILE_ENABLE_PREFIX_CACHING": "maybe"}, "expected true or false"),
    (["--max-queue-size", "-1"], {}, "max_queue_size must be >= 0"),
])
def test_bad_values_are_usage_errors_naming_the_knob(capsys, argv, env, message):
    with pytest.raises(SystemExit) as raised:
        parse_config(argv, environ=env)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_the_service_never_imports_torch():
    # Everything the front end loads, including the engine process's entry module (spawn imports
    # it by name) and the client stubs; torch is imported only inside the engine process.
    code = ("import sys, service.server, service.__main__, engine.process; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "[]\n"
