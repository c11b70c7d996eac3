"""``python -m durq.cli``: the command line."""

from durq.cli import main

if __name__ == "__main__":
    main()
