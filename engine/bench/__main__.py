"""`python -m engine.bench decode|scheduling|ipc|serving|attention ...`: see each benchmark's --help."""

import importlib
import sys

COMMANDS = ("decode", "scheduling", "ipc", "serving", "attention")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(f"usage: python -m engine.bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        raise SystemExit(2)
    # Imported on demand: `ipc` needs no torch, the others load it.
    importlib.import_module(f"engine.bench.{sys.argv[1]}").main(sys.argv[2:])


if __name__ == "__main__":
    main()
