"""bertjax: BERT pretraining in JAX/Flax, TPU first."""

__version__ = "0.1.0"
