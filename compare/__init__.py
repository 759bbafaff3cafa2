"""Runs both twins as subprocesses and compares their run records. Imports neither framework."""
