"""`turnstile [generate] "prompt"`: stream a completion to stdout.

Exit status: 0 done, 1 a failed call ("error: CODE: message" on stderr), 130 interrupted (Ctrl-C
cancels the call). A leading word "generate" is dropped, so `python -m clients.python generate
"prompt"` and `turnstile "prompt"` are the same command.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from turnstile_client.client import DEFAULT_ADDRESS, Client
from turnstile_client.errors import TurnstileError
from turnstile_client.messages import Chunk


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turnstile", description="Stream a completion from a Turnstile server.")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when omitted)")
    p.add_argument("--address", default=os.environ.get("TURNSTILE_ADDRESS", DEFAULT_ADDRESS),
                   help="host:port (env TURNSTILE_ADDRESS, default %(default)s)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float, help="0 is greedy (server default 1.0)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message rendered with the model's chat template")
    p.add_argument("--api-key", default=os.environ.get("TURNSTILE_API_KEY"),
                   help="sent as 'authorization: Bearer KEY' (env TURNSTILE_API_KEY)")
    p.add_argument("--tls", action="store_true", help="use TLS with the system root certificates")
    p.add_argument("--ca-cert", metavar="PEM", help="use TLS with these root certificates")
    p.add_argument("--timeout", type=float, help="deadline of the call, in seconds")
    p.add_argument("--show-usage", action="store_true",
                   help="print the finish reason, token counts and timings to stderr at the end")
    return p


def _usage_line(last: Chunk) -> str:
    fields = {"finish_reason": last.finish_reason}
    fields.update(vars(last.usage) if last.usage else {})
    fields.update({k: f"{v:.3f}" for k, v in vars(last.timings).items()} if last.timings else {})
    return " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv[1:] if argv[:1] == ["generate"] else argv)
    prompt = sys.stdin.read() if args.prompt is None else args.prompt
    if args.chat:
        prompt = [{"role": "user", "content": prompt}]
    tls: bool | bytes = args.tls
    if args.ca_cert:
        with open(args.ca_cert, "rb") as f:
            tls = f.read()

    last = None
    try:
        with Client(args.address, api_key=args.api_key, tls=tls, timeout=args.timeout) as client:
            stream = client.generate_stream(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                            top_p=args.top_p, seed=args.seed, stop=args.stop)
            with contextlib.closing(stream):  # closing cancels the call, also on Ctrl-C
                for last in stream:
                    sys.stdout.write(last.text)
                    sys.stdout.flush()
    except TurnstileError as error:
        print(f"\nerror: {error}" if last else f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    sys.stdout.write("\n")
    if args.show_usage and last:
        print(_usage_line(last), file=sys.stderr)
    return 0
