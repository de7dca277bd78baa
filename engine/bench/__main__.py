"""`python -m engine.bench decode ...`: see each benchmark's --help."""

import sys

from engine.bench import decode, scheduling


def main() -> None:
    commands = {"decode": decode.main, "scheduling": scheduling.main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python -m engine.bench {{{','.join(commands)}}} [options]", file=sys.stderr)
        raise SystemExit(2)
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
