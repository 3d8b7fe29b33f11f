"""``python -m delivery.testing.stub_provider --port 9090``: the stub in the foreground."""

from delivery.testing.stub_provider.server import main

if __name__ == "__main__":
    main()
