"""`python -m service --help`: serve a model over gRPC."""

from service.server import main

if __name__ == "__main__":
    main()
