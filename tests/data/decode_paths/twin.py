"""Hostile decode paths for --generate (tests/test_generation.py): the Llama example's twin with a
`decode` that names a function its file lacks, and decode functions that break the contract."""

import dataclasses
import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama"
_spec = importlib.util.spec_from_file_location("llama_example_twin", EXAMPLE / "twin.py")
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)

base = dataclasses.replace(
    _example.llama_hf,
    torch=str(EXAMPLE / "hf_llama.py:llama"),
    nnx=str(EXAMPLE / "nnx_llama.py:Llama"),
)
missing_name = dataclasses.replace(base, decode={"nnx": str(EXAMPLE / "nnx_llama.py:no_such")})
