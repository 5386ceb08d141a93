"""Recipes: the recipe files the Spark community shares (sparkrun's and eugr's), read into
this program's stack config and written back from it.

- `formats`: the two formats read as their tools read them (fields, template, argv words);
- `mapping`: a recipe as a `models` entry and the image, and a stack's model as a recipe;
- `library/`: the project's own recipes for the Spark, in sparkrun's format;
- `python -m sparkvllm.recipes import|export|list`: the command (docs/recipes.md).
"""

from __future__ import annotations

from pathlib import Path

LIBRARY = Path(__file__).parent / "library"


def shipped() -> dict[str, Path]:
    """The project's recipes by name (the file's stem, as sparkrun names a recipe)."""
    return {p.stem: p for p in sorted(LIBRARY.glob("*.yaml"))}
