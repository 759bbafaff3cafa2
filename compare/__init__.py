"""Runs every backend as a subprocess and compares their run records. Imports no framework."""
