"""Offline data creation: documents -> the paper's NSP pairs and masks ->
pre-masked TFRecord shards (local driver and Apache Beam), and the demo data."""
