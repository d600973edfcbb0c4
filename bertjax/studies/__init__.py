"""The recipe studies: the paper's objectives, a modern recipe and the downstream suite
at demo scale (`python -m bertjax.studies.<name>`; docs/recipes.md)."""
