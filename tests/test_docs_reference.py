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


def test_the_docs_site_builds_strict_with_every_page_in_its_nav(tmp_path):
    """make docs' build (MkDocs, Material, --strict: a broken link or an unlisted page fails it),
    every page of docs/ in the nav, the generated references among them."""
    import os
    import subprocess
    import sys

    nav = (REPO / "mkdocs.yml").read_text()
    pages_ = sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))
    assert [p for p in pages_ if f" {p}" not in nav] == []
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    how_to = (tmp_path / "how-to" / "prove-your-decode-path" / "index.html").read_text()
    assert "Prove your decode path" in how_to and "--generate" in how_to
    assert "--generate" in (tmp_path / "reference" / "cli" / "index.html").read_text()
