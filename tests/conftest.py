"""Test-wide settings.

gRPC's fork handlers must be off: tests start Envoy and workers as child processes while an
in-process picker runs gRPC threads, and with the handlers on a forked child can crash before
exec ("Other threads are currently calling into gRPC, skipping fork() handlers", then SIGSEGV).
This must happen before grpc is first imported, hence here.
"""

import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
