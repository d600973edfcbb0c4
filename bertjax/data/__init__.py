"""Data layer: text -> tokens -> pre-masked TFRecords -> batches."""
