#!/bin/bash
# OpenSandbox code-interpreter entrypoint. In Airlock, execd (PID 1) serves the code
# contexts itself, starting Jupyter kernels on demand; this script only keeps the sandbox
# alive for clients that name it as their entrypoint.
exec tail -f /dev/null
