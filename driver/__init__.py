"""The backend-process driver: what every `python -m <backend>` process runs around its framework's
loop (flags, run directory, record, exit code: backend_main; the run's bookkeeping: harness; a
twin's describe steps: describe_sides; the cause of a loss that is not finite: nonfinite; the
process's flags and exit: process).

It imports no framework, and compare never imports it: compare starts these processes and reads what
they write (common/files/record.py) and say (common/protocol.py). Backends import it; it imports
common.
"""
