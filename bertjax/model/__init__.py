"""Model layer: pure Flax modules for the BERT encoder and pretraining heads."""
