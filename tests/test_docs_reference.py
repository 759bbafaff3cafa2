"""The reference pages generated from the code (compare/docs_reference.py): the command line from
compare's parser and the `Twin` fields from the dataclass, held in sync with what is committed."""

from compare.docs_reference import REPO, pages


def test_the_generated_references_are_the_committed_ones():
    for path, text in pages().items():
        committed = path.read_text() if path.exists() else ""
        assert committed == text, (
            f"{path.relative_to(REPO)} is out of date with the code it describes: run "
            "`python -m compare.docs_reference` (make docs-reference) and commit it"
        )
    cli, twin = (p.read_text() for p in pages())
    for flag in ("--twin", "--backend", "--checkpoint", "--dtype", "--activations"):
        assert f"| `{flag}`" in cli, flag
    for field in ("torch", "nnx", "rename", "layouts", "hf", "forward_kwargs", "train"):
        assert f"| `{field}` |" in twin, field
    assert "/work/" not in cli and "/root" not in cli  # nothing of one machine
