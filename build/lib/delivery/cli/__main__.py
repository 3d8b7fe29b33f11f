"""``python -m delivery.cli``: the ``delivery`` command."""

from delivery.cli import main

if __name__ == "__main__":
    main()
