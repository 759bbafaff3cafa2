"""A preloading fork server for backend processes (the test suite's, opt-in by XLA_TWINS_PRELOAD).

Every backend process of a run starts a fresh interpreter and imports its frameworks: 1-4 s of CPU
each, and the suite starts hundreds. A server (preload/server.py) imports one set of frameworks
once, without initialising any device, and forks a child per request that then runs `python -m
MODULE ARGS` or `python -c CODE ARGS` as that interpreter would. preload/client.py starts a process
through a server where one serves its interpreter, modules and environment, and as a plain
subprocess otherwise. Stdlib only.
"""
