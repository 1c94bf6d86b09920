from placement.grpc_env import quiet_grpc_core

quiet_grpc_core()  # before replica.cli imports grpc

from replica.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
