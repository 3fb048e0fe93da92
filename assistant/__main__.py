"""``python -m assistant`` → the command line."""

from assistant.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
