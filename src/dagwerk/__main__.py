"""``python -m dagwerk``: the same as the ``dagwerk`` command."""

from dagwerk.cli import main

if __name__ == "__main__":
    main()
