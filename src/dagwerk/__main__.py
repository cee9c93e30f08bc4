"""``python -m dagwerk``: the same as the ``dagwerk`` command.

``python -m`` puts the current directory first on ``sys.path``; the command
searches it after the installed packages (as the ``dagwerk`` script does),
so it is taken off the front here and the command appends it.
"""

import os
import sys

if __name__ == "__main__":
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]

    from dagwerk.cli import main

    main()
