"""Checkpoint conversion to and from other BERT implementations."""
